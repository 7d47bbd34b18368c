"""scripts/bench --peers' report, fed recorded measurements (no benchmark runs): every row prints
the tools its own figures came from, a candidate whose package is missing is a row that says so,
a ratio above 1.0 against a limit is called a moved limit, and the limits are the median of
their samples with the spread beside it."""

import sys
import types

import pytest

from conftest import import_benchmark

MiB = 1 << 20


@pytest.fixture(scope="module")
def pb():
    yield import_benchmark("peers_bench")
    for name in ("peer_candidates", "run_bench", "sink_bench", "bench_proc"):
        sys.modules.pop(name, None)


def ok_row(name, sources, durable=2.0, restore=1.0):
    return {"status": "ok", "candidate": name, "state_bytes": 1024 * MiB, "tensors": 78,
            "blocked_s": 0.5, "durable_s": durable, "loop_lost_s": 0.6, "restore_s": restore,
            "bytes_on_disk": 1024 * MiB, "peak_rss_bytes": 3000 * MiB,
            "rss_before_bytes": 1500 * MiB, "sources": sources}


def recorded_run():
    cpp = {"blocked": "Checkpointer.totals() blocked_seconds (C++)",
           "durable": "Checkpointer.totals() seconds_to_durable (C++)",
           "restore": "perf_counter around the call (page cache dropped: posix_fadvise)"}
    dcp = {"blocked": "perf_counter around the call",
           "durable": "perf_counter until the async_save future's done callback",
           "restore": "perf_counter around the call (page cache dropped: posix_fadvise)"}
    samples = [{"memcpy": 4e9, "write": w, "read": r}
               for w, r in ((900e6, 3.6e9), (1.0e9, 3.0e9), (1.1e9, 1.8e9), (800e6, 2.4e9))]
    return {"layout": "transformer", "save_every": 30, "limits": samples,
            "rows": [ok_row("asyncckpt-cpp-async", cpp, durable=0.8),
                     {"status": "missing", "candidate": "asyncckpt-jax",
                      "reason": "missing: asyncckpt.jax not importable"},
                     ok_row("dcp.async_save", dcp, durable=2.0, restore=2.0)]}


def report_of(pb, run):
    run["summary"] = pb.summarize(run)
    run["best_peer"] = pb.best_peer(run["summary"])
    machine = {"date": "2026-11-27T21:00:00", "cores": 2, "kernel": "6.1",
               "load_average_at_start": (0.5, 0.5, 0.5)}
    return {"machine": machine, "command": "scripts/bench --peers", "step_ms": 100, "saves": 3,
            "runs": {"1 GiB transformer": run}}


def table_line(text, candidate, heading):
    """The line of `candidate` in the table under `heading`."""
    section = text.split(heading, 1)[1]
    return next(line for line in section.splitlines() if line.startswith(f"| {candidate} |"))


def test_each_row_prints_the_tools_its_own_figures_came_from(pb):
    run = recorded_run()
    text = pb.markdown(report_of(pb, run))
    for row in run["rows"]:
        if row["status"] != "ok":
            continue
        line = table_line(text, row["candidate"], "Sources:")
        for figure, tool in row["sources"].items():
            assert f"{figure}: {tool}" in line
    other = table_line(text, "dcp.async_save", "Sources:")
    assert "Checkpointer.totals()" not in other


def test_a_missing_package_is_a_row_that_says_so(pb):
    text = pb.markdown(report_of(pb, recorded_run()))
    line = table_line(text, "asyncckpt-jax", "| candidate | blocked")
    assert "missing: asyncckpt.jax not importable" in line


def test_a_candidate_whose_module_cannot_be_imported_is_measured_as_missing(pb, tmp_path,
                                                                            monkeypatch):
    pc = sys.modules["peer_candidates"]
    absent = type("Absent", (pc.Candidate,), {"modules": ("numpy", "asyncckpt_no_such_module")})
    monkeypatch.setitem(pc.CANDIDATES, "absent", absent)
    args = types.SimpleNamespace(candidate="absent", layout="transformer", bytes=MiB,
                                 dir=str(tmp_path / "x"), save_every=3, saves=1, step_ms=1)
    assert pc.measure(args) == {"status": "missing",
                                "reason": "missing: asyncckpt_no_such_module not importable"}
    assert not (tmp_path / "x").exists()
    assert pc.missing_reason("torch.save") is None


def test_limits_are_the_median_of_their_samples_with_the_spread(pb):
    summary = pb.summarize(recorded_run())
    write = summary["limits"]["write"]
    assert write["median"] == pytest.approx(950e6)
    assert (write["min"], write["max"]) == (800e6, 1.1e9)
    assert write["spread"] == pytest.approx(300e6 / 950e6)
    assert len(write["samples"]) == 4
    row = summary["rows"][0]
    assert row["persist_over_write"] == pytest.approx(1024 * MiB / 0.8 / 950e6)
    assert row["rss_over_state"] == pytest.approx((3000 - 1500 + 1024) / 1024)


def test_a_ratio_above_one_says_the_limit_moved(pb):
    run = recorded_run()
    text = pb.markdown(report_of(pb, run))
    ours = table_line(text, "asyncckpt-cpp-async", "| candidate | blocked")
    theirs = table_line(text, "dcp.async_save", "| candidate | blocked")
    assert run["summary"]["rows"][0]["persist_over_write"] > 1.0
    assert "(limit moved)" in ours.split("|")[4]
    assert "(limit moved)" not in theirs


def test_the_best_peer_comparison_names_who_wins_each_figure(pb):
    run = recorded_run()
    report_of(pb, run)
    by_figure = {b["figure"]: b for b in run["best_peer"]}
    durable = by_figure["durable s"]
    assert (durable["ours"], durable["peer"]) == ("asyncckpt-cpp-async", "dcp.async_save")
    assert durable["ratio"] == pytest.approx(0.4) and not durable["peer_wins"]
    assert not by_figure["restore s (cold)"]["peer_wins"]


def test_the_markdown_lists_every_figure_of_the_best_peer_comparison(pb):
    run = recorded_run()
    text = pb.markdown(report_of(pb, run))
    section = text.split("| figure | asyncckpt's best |", 1)[1].split("Sources:", 1)[0]
    listed = [line.split(" | ")[0].lstrip("| ") for line in section.splitlines()
              if line.startswith("| ") and not line.startswith("|---")]
    assert listed == [b["figure"] for b in run["best_peer"]]
    assert len(listed) > 1
