"""The package installs the way Python packages do (CTest label "install": it builds the
library in Release, minutes on a cold cache):

- `pip install --no-build-isolation .` into a venv made with --system-site-packages, then
  import, save and restore from outside the source tree, and the Python tests from the venv;
- `python3 -m build --wheel --no-isolation`: a stripped module with RPATH $ORIGIN, the
  non-system libraries it loads beside it, __version__ and dist-info agreeing with CMake's
  project version, py.typed and the _core stub.

Run alone: ctest --test-dir build -L install -R python --output-on-failure
The CMake build tree setup.py uses is kept in <build>/tests/pip_install/cmake between runs.
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
    """The environment without the build tree's package on the path, and CMake's build dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["ASYNCCKPT_CMAKE_BUILD_DIR"] = str(WORK / "cmake")
    env.setdefault("ASYNCCKPT_BUILD_JOBS", str(os.cpu_count() or 1))
    return env


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def project_version():
    text = (SOURCE_DIR / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*asyncckpt\s+VERSION\s+([0-9.]+)", text).group(1)


@pytest.fixture(scope="module")
def venv():
    path = WORK / "venv"
    shutil.rmtree(path, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    # Debian's interpreter: its site-packages hold numpy, torch and pytest.
    run(["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable, "-m",
         "venv", "--system-site-packages", str(path)])
    run([str(path / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
         str(SOURCE_DIR)], env=clean_env(), cwd=WORK)
    return path


SAVE_AND_RESTORE = """
import pathlib, sys, tempfile
import numpy as np
import asyncckpt
assert pathlib.Path(asyncckpt.__file__).is_relative_to(pathlib.Path(sys.prefix)), asyncckpt.__file__
with tempfile.TemporaryDirectory() as directory:
    with asyncckpt.CheckpointManager(directory, save_steps=5) as manager:
        for step in range(1, 11):
            manager.maybe_save(step, {"w": np.full(3, step, dtype=np.float32), "step": step})
    state = {"w": np.zeros(3, dtype=np.float32), "step": 0}
    with asyncckpt.CheckpointManager(directory) as manager:
        assert manager.restore(state) == 10 and manager.all_steps() == [5, 10]
    assert state["step"] == 10 and state["w"].tolist() == [10.0, 10.0, 10.0]
print(asyncckpt.__version__)
"""


def test_pip_install_into_a_venv_imports_saves_and_restores_outside_the_source_tree(
        venv, tmp_path):
    done = run([str(venv / "bin" / "python"), "-c", SAVE_AND_RESTORE], env=clean_env(),
               cwd=tmp_path)
    assert done.stdout.split() == [project_version()]
    shown = run([str(venv / "bin" / "pip"), "show", "asyncckpt"], env=clean_env(), cwd=tmp_path)
    assert f"Version: {project_version()}" in shown.stdout


def test_the_python_tests_pass_from_the_venv(venv, tmp_path):
    tests = SOURCE_DIR / "tests" / "python"
    run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(tests / "test_steps.py"), str(tests / "test_stateful.py"),
         str(tests / "test_manager.py"), str(tests / "test_dtypes.py")],
        env=dict(clean_env(), ASYNCCKPT_SOURCE_DIR=str(SOURCE_DIR)), cwd=tmp_path)


def test_the_wheel_is_stripped_and_carries_the_libraries_it_loads(venv, tmp_path):
    run([str(venv / "bin" / "python"), "-m", "build", "--wheel", "--no-isolation", "--outdir",
         str(tmp_path), str(SOURCE_DIR)], env=clean_env(), cwd=SOURCE_DIR)
    (wheel,) = tmp_path.glob("asyncckpt-*.whl")
    assert wheel.name.startswith(f"asyncckpt-{project_version()}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "wheel")
    package = tmp_path / "wheel" / "asyncckpt"
    for expected in ("asyncckpt/py.typed", "asyncckpt/_core.pyi", "asyncckpt/_version.py",
                     f"asyncckpt-{project_version()}.dist-info/METADATA"):
        assert expected in names, names
    (module,) = package.glob("_core*.so")
    dynamic = run(["readelf", "-d", str(module)]).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic)
    assert re.search(r"\((RUNPATH|RPATH)\).*\[\$ORIGIN\]", dynamic), dynamic
    bundled = sorted(n for n in needed if re.match(r"lib(tbb|uring|zstd|xxhash|cudart)", n))
    assert len(bundled) >= 4, needed
    for soname in bundled:
        assert (package / soname).is_file(), f"{soname} is not in the wheel: {names}"
    sections = run(["readelf", "-S", "-W", str(module)]).stdout
    assert ".symtab" not in sections and ".debug_info" not in sections, "not stripped"
