"""`cmake --install` puts an importable package under the prefix."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import BUILD_DIR


def test_cmake_install_puts_an_importable_package_under_the_prefix(tmp_path):
    relative = os.environ.get("ASYNCCKPT_PYTHON_INSTALL_DIR")
    cmake = os.environ.get("ASYNCCKPT_CMAKE", "cmake")
    if not relative or not (BUILD_DIR / "cmake_install.cmake").exists():
        pytest.skip("run from CTest, which names the build tree and the install directory")
    subprocess.run([cmake, "--install", str(BUILD_DIR), "--component", "python", "--prefix",
                    str(tmp_path)], check=True, capture_output=True)
    site = tmp_path / relative
    assert (site / "asyncckpt" / "__init__.py").exists()
    assert list((site / "asyncckpt").glob("_core*.so"))
    env = dict(os.environ, PYTHONPATH=str(site))
    found = subprocess.run(
        [sys.executable, "-c",
         "import asyncckpt; print(asyncckpt.__file__); print(asyncckpt.CheckpointManager.__name__)"],
        env=env, check=True, capture_output=True, text=True, cwd=tmp_path)
    path, name = found.stdout.split()
    assert pathlib.Path(path).is_relative_to(site) and name == "CheckpointManager"
