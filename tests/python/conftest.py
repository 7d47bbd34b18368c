"""Shared set-up for the Python tests: CTest runs them with PYTHONPATH pointing at the build
tree's package (build/python) and ASYNCCKPT_SOURCE_DIR / ASYNCCKPT_BUILD_DIR set; by hand:

    PYTHONPATH=build/python ASYNCCKPT_BUILD_DIR=build .venv/bin/python -m pytest tests/python
"""

import importlib.util
import os
import pathlib
import signal
import subprocess
import types

import pytest

SOURCE_DIR = pathlib.Path(
    os.environ.get("ASYNCCKPT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("ASYNCCKPT_BUILD_DIR", SOURCE_DIR / "build"))


def import_benchmark(name):
    """benchmarks/<name>.py as a module: the benchmarks are scripts, not a package."""
    spec = importlib.util.spec_from_file_location(name, SOURCE_DIR / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module, types.ModuleType)
    return module


@pytest.fixture
def ckpt_dir(tmp_path):
    """An empty directory for checkpoints."""
    path = tmp_path / "ckpt"
    path.mkdir()
    return path


def run_and_kill(command, steps_before_kill, after=None):
    """Starts a training example (``command``, with --progress), SIGKILLs it once it has printed
    ``steps_before_kill`` lines "step N" (counted from the first line starting with ``after``,
    when given: a run that makes a checkpoint durable before it dies resumes later, however
    slow the machine); returns the step it resumed from (0: a fresh start)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    resumed_from = 0
    seen = 0
    counting = after is None
    for line in process.stdout:
        if line.startswith("resumed from step "):
            resumed_from = int(line.split()[-1])
        elif after is not None and line.startswith(after):
            counting = True
        elif counting and line.startswith("step ") and len(line.split()) == 2:
            seen += 1
            if seen == steps_before_kill:
                process.send_signal(signal.SIGKILL)
                break
    process.stdout.close()
    assert process.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    return resumed_from
