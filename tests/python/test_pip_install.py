"""The package installs the way Python packages do (CTest labels "python" and "install"):

- `pip install .` into a plain venv (no system site packages, no flags): pip builds it in an
  isolated environment through pyproject.toml's backend (scikit-build-core), then the package
  imports, saves and restores from outside the source tree;
- `pip wheel .`: a stripped module with RPATH $ORIGIN, the non-system libraries it loads beside
  it, __version__ and dist-info agreeing with CMake's project version, py.typed and the stubs;
- that wheel in another plain venv that has numpy and no torch: the numpy-only path works.

Both builds keep CMake's build tree in <build>/tests/pip_install/skbuild (SKBUILD_BUILD_DIR), so
only the first compiles the library (in Release: minutes on a cold cache). pip fetches the build
backend and numpy from Python's package index.

Run alone: ctest --test-dir build -R python_test_pip_install --output-on-failure
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import BUILD_DIR, SOURCE_DIR

WORK = BUILD_DIR / "tests" / "pip_install"


def clean_env():
    """The environment without the build tree's package on the path, with a kept build tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["SKBUILD_BUILD_DIR"] = str(WORK / "skbuild")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(command, **kwargs):
    # Checked here rather than with check=True, so that a failure shows pip's and CMake's output.
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def project_version():
    text = (SOURCE_DIR / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*asyncckpt\s+VERSION\s+([0-9.]+)", text).group(1)


def plain_venv(name):
    """A new venv without system site packages, made from the interpreter running the tests."""
    path = WORK / name
    shutil.rmtree(path, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "venv", str(path)])
    config = (path / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config, config
    return path


@pytest.fixture(scope="module")
def installed_venv():
    """`pip install .` of the source tree into a plain venv."""
    path = plain_venv("venv-install")
    run([str(path / "bin" / "pip"), "install", str(SOURCE_DIR)], env=clean_env(), cwd=WORK)
    return path


@pytest.fixture(scope="module")
def wheel():
    """The wheel that `pip wheel .` builds."""
    out = WORK / "wheelhouse"
    shutil.rmtree(out, ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(SOURCE_DIR)],
        env=clean_env(), cwd=WORK)
    (built,) = out.glob("asyncckpt-*.whl")
    return built


SAVE_AND_RESTORE = """
import importlib.util, pathlib, sys, tempfile
import numpy as np
import asyncckpt
assert pathlib.Path(asyncckpt.__file__).is_relative_to(pathlib.Path(sys.prefix)), asyncckpt.__file__
with tempfile.TemporaryDirectory() as directory:
    weights = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    with asyncckpt.CheckpointManager(directory, save_interval_steps=5) as manager:
        for step in range(1, 11):
            manager.maybe_save(step, {"w": weights + step, "step": step, "name": "run"})
    state = {"w": np.zeros_like(weights), "step": 0, "name": ""}
    with asyncckpt.CheckpointManager(directory) as manager:
        assert manager.restore(state) == 10 and manager.all_steps() == [5, 10]
    assert state["step"] == 10 and state["name"] == "run"
    assert state["w"].tobytes() == (weights + 10).tobytes(), "not bit-exact"
    loaded = asyncckpt.load(directory)
    assert loaded["w"].tobytes() == (weights + 10).tobytes()
print(asyncckpt.__version__, importlib.util.find_spec("torch") is not None)
"""


def test_pip_install_into_a_plain_venv_saves_and_restores_outside_the_source_tree(
        installed_venv, tmp_path):
    done = run([str(installed_venv / "bin" / "python"), "-c", SAVE_AND_RESTORE], env=clean_env(),
               cwd=tmp_path)
    assert done.stdout.split()[0] == project_version()
    shown = run([str(installed_venv / "bin" / "pip"), "show", "asyncckpt"], env=clean_env(),
                cwd=tmp_path)
    assert f"Version: {project_version()}" in shown.stdout
    assert "Requires: numpy" in shown.stdout


def test_the_wheel_is_stripped_and_carries_the_libraries_it_loads(wheel, tmp_path):
    assert wheel.name.startswith(f"asyncckpt-{project_version()}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "wheel")
    package = tmp_path / "wheel" / "asyncckpt"
    for expected in ("asyncckpt/__init__.py", "asyncckpt/py.typed", "asyncckpt/_core.pyi",
                     "asyncckpt/_version.py",
                     f"asyncckpt-{project_version()}.dist-info/METADATA"):
        assert expected in names, names
    (module,) = package.glob("_core*.so")
    dynamic = run(["readelf", "-d", str(module)]).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic)
    assert re.search(r"\((RUNPATH|RPATH)\).*\[\$ORIGIN\]", dynamic), dynamic
    bundled = sorted(n for n in needed if re.match(r"lib(tbb|uring|zstd|xxhash|cudart)", n))
    assert len(bundled) >= 4, needed
    assert not any(n.startswith("libcudart") for n in bundled), "CUDA is opt-in for a wheel"
    licenses = tmp_path / "wheel" / f"asyncckpt-{project_version()}.dist-info" / "licenses"
    for soname in bundled:
        assert (package / soname).is_file(), f"{soname} is not in the wheel: {names}"
        text = (licenses / "bundled" / f"{soname}.txt").read_text()
        assert "Copyright" in text or "License" in text, text[:200]
    assert "Apache License" in (licenses / "LICENSE").read_text()
    sections = run(["readelf", "-S", "-W", str(module)]).stdout
    assert ".symtab" not in sections and ".debug_info" not in sections, "not stripped"
    metadata = (tmp_path / "wheel" / f"asyncckpt-{project_version()}.dist-info" /
                "METADATA").read_text()
    assert re.search(r"^License-Expression: Apache-2.0$", metadata, re.MULTILINE), metadata
    assert re.search(r"^Requires-Dist: torch.*extra == .torch.", metadata, re.MULTILINE), metadata
    assert re.search(r"^Requires-Dist: jax.*extra == .jax.", metadata, re.MULTILINE), metadata


def test_the_wheel_works_with_numpy_alone_in_a_plain_venv(wheel, tmp_path):
    path = plain_venv("venv-wheel-numpy")
    run([str(path / "bin" / "pip"), "install", str(wheel)], env=clean_env(), cwd=WORK)
    done = run([str(path / "bin" / "python"), "-c", SAVE_AND_RESTORE], env=clean_env(),
               cwd=tmp_path)
    version, has_torch = done.stdout.split()
    assert version == project_version()
    assert has_torch == "False", "the venv was meant to have no torch"
