"""scripts/bench's restore column comes from the tool its report names: restore-bench's figure
(read from its JSON's repeats) where the CLI has that command, and the report says which tool
measured each row, all of a row's repeats from one tool."""

import json
import os
import stat
import subprocess
import types

import numpy as np
import pytest

import asyncckpt
from conftest import BUILD_DIR, import_benchmark


def load_run_bench():
    return import_benchmark("run_bench")


@pytest.fixture
def checkpoint(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, compression="none") as manager:
        manager.save(1, {"w": np.ones(1 << 18, dtype=np.float32)})
        return manager.checkpoint_path(1)


def bench_args(tmp_path, cli):
    return types.SimpleNamespace(build=str(BUILD_DIR), cli=str(cli), restore_runs=3,
                                 restore_bench=True, bench_dir=str(tmp_path))


@pytest.fixture
def tools():
    cli = BUILD_DIR / "bin" / "asyncckpt"
    reader = BUILD_DIR / "benchmarks" / "restore_read"
    if not cli.exists() or not reader.exists():
        pytest.skip("needs the CLI and benchmarks/restore_read in the build")
    return cli, reader


def test_the_restore_figure_is_restore_benchs_and_the_row_says_so(checkpoint, tmp_path, tools):
    rb = load_run_bench()
    rate, tool = rb.restore(bench_args(tmp_path, tools[0]), checkpoint, "async-uring")
    assert tool == rb.RESTORE_BENCH
    out = subprocess.run([str(tools[0]), "restore-bench", checkpoint, "--json", "--repeat", "2"],
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(out[out.index("{"):])
    assert rb.restore_bench_rate(out) == pytest.approx(
        np.median([r["read_bytes_per_second"] for r in doc["repeats"]]))
    assert rate > 0


def test_a_cli_that_gives_no_rate_leaves_the_whole_row_to_restore_read(checkpoint, tmp_path,
                                                                        tools):
    rb = load_run_bench()
    broken = tmp_path / "asyncckpt"
    broken.write_text("#!/bin/sh\necho '{\"repeats\": []}'\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    rate, tool = rb.restore(bench_args(tmp_path, broken), checkpoint, "async-uring")
    assert tool == rb.RESTORE_READ and rate > 0
    rate, tool = rb.restore(bench_args(tmp_path, tools[0]), checkpoint, "naive")
    assert tool == rb.RESTORE_READ


def test_the_report_names_the_tool_of_every_row():
    rb = load_run_bench()
    results = {"1 GiB": {"layouts": {"large": {
        "sync": {"metrics": {"restore_tool": rb.RESTORE_BENCH}},
        "naive": {"metrics": {"restore_tool": rb.RESTORE_READ}}}}}}
    tools = rb.restore_tools(results)
    assert tools == {rb.RESTORE_BENCH: ["1 GiB large sync"], rb.RESTORE_READ: ["1 GiB large naive"]}
    sentence = rb.describe_restore_tools(tools)
    assert f"`{rb.RESTORE_BENCH}` in 1 GiB large sync" in sentence
    assert f"`{rb.RESTORE_READ}` in 1 GiB large naive" in sentence
    assert os.path.basename(rb.__file__) == "run_bench.py"
