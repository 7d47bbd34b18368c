"""Shared set-up for the Python tests: CTest runs them with PYTHONPATH pointing at the build
tree's package (build/python) and ASYNCCKPT_SOURCE_DIR / ASYNCCKPT_BUILD_DIR set; by hand:

    PYTHONPATH=build/python ASYNCCKPT_BUILD_DIR=build .venv/bin/python -m pytest tests/python
"""

import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(
    os.environ.get("ASYNCCKPT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("ASYNCCKPT_BUILD_DIR", SOURCE_DIR / "build"))


@pytest.fixture
def ckpt_dir(tmp_path):
    """An empty directory for checkpoints."""
    path = tmp_path / "ckpt"
    path.mkdir()
    return path
