# ctest-labels: torchrun
"""A rank of a torch.distributed job that dies between saves fails the survivors' next save at
once with an error that names it, as the MPI mode does, and never names a rank that is merely
slow; the heartbeat behind it never aborts a process at exit. Gloo ranks spawned here (rank 0
hosts torch.distributed's store, as init_process_group's env:// has it)."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import asyncckpt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WORLD = 3
KILLED = 9  # the exit code of a rank that dies


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def save_outcome(manager, step, state) -> str:
    try:
        manager.save(step, state)
        manager.wait_until_finished()
    except Exception as error:  # noqa: BLE001 - reported to the test
        return f"{type(error).__name__}: {error}"
    return "no error"


def wait_for_reports(report: str, victim: int, busy: bool = False) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not all(
            os.path.exists(f"{report}.{r}") for r in range(WORLD) if r != victim):
        if busy:
            sum(range(10_000))
        else:
            time.sleep(0.1)


def rank_main(rank: int, scenario: str, victim: int, directory: str, port: int,
              report: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    # Collectives that give up on a missing rank after 5 s: the slow rank's peers fail by it.
    group = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=5))
    manager = asyncckpt.CheckpointManager(directory, process_group=group)
    state = {"w": torch.full((1024,), float(rank))}
    manager.save(1, state)
    manager.wait_until_finished()
    if rank == victim:
        if scenario == "dies":
            os._exit(KILLED)  # as SIGKILL would: no clean-up, no goodbye
        # Healthy but slow: a training thread busy in Python (holding the GIL between switches)
        # until its peers have given up on it and reported, well past the roll call.
        wait_for_reports(report, victim, busy=True)
        os._exit(0)
    time.sleep(1)
    started = time.monotonic()
    outcome = save_outcome(manager, 2, state)
    with open(f"{report}.{rank}.tmp", "w") as out:
        out.write(f"{time.monotonic() - started:.1f}\n{outcome}")
    os.rename(f"{report}.{rank}.tmp", f"{report}.{rank}")
    # Rank 0 hosts the store: it stays until every survivor's roll call is done.
    wait_for_reports(report, victim)
    os._exit(0)  # the process group cannot be destroyed without the missing rank


def run_job(tmp_path, scenario: str, victim: int) -> dict[int, tuple[float, str]]:
    """Runs the ranks; each survivor's (seconds its second save took to fail, outcome)."""
    report = str(tmp_path / "report")
    context = mp.get_context("spawn")
    port = free_port()
    ranks = [context.Process(target=rank_main,
                             args=(r, scenario, victim, str(tmp_path / "ckpt"), port, report))
             for r in range(WORLD)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(180)
    expected = [KILLED if r == victim and scenario == "dies" else 0 for r in range(WORLD)]
    assert [p.exitcode for p in ranks] == expected, "a rank hung, aborted or failed on its own"
    outcomes = {}
    for rank in range(WORLD):
        if rank != victim:
            with open(f"{report}.{rank}") as reported:
                seconds, outcome = reported.read().split("\n", 1)
            outcomes[rank] = (float(seconds), outcome)
    # The checkpoint every rank committed before is whole.
    assert asyncckpt.CheckpointManager(tmp_path / "ckpt").all_steps() == [1]
    return outcomes


def test_a_dead_rank_fails_the_survivors_next_save_naming_it(tmp_path):
    for rank, (seconds, outcome) in run_job(tmp_path, "dies", victim=2).items():
        assert "rank 2 of the job is gone" in outcome, (rank, outcome)
        assert "ranks " not in outcome and "rank 0 " not in outcome, (rank, outcome)
        assert seconds < 15, (rank, seconds, outcome)  # a roll call of 3 s, not a timeout


def test_a_dead_rank_0_hosting_the_store_is_reported_without_naming_a_healthy_rank(tmp_path):
    # Under env:// the store dies with rank 0; under torchrun its agent hosts the store, and
    # rank 0 is named like any other.
    for rank, (seconds, outcome) in run_job(tmp_path, "dies", victim=0).items():
        assert "torch.distributed's store did not answer" in outcome, (rank, outcome)
        assert "of the job is gone" not in outcome, (rank, outcome)
        assert seconds < 30, (rank, seconds, outcome)


def test_a_slow_rank_is_never_named(tmp_path):
    for rank, (seconds, outcome) in run_job(tmp_path, "slow", victim=2).items():
        assert outcome != "no error", rank  # the 5 s collective timeout fired
        assert "of the job is gone" not in outcome, (rank, outcome)


EXIT_SCRIPT = textwrap.dedent("""
    import datetime, os, subprocess, sys, time
    import torch, torch.distributed as dist
    import asyncckpt, asyncckpt._coordination as coordination

    coordination.HEARTBEAT_SECONDS = 0  # beats back to back: nearly always inside the store
    ending, port, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if ending == "hostless":  # the store's host (torchrun's agent, say) is gone before the beat
        host = subprocess.Popen([sys.executable, "-c", HOST, str(port)], stdout=subprocess.PIPE,
                                text=True)
        host.stdout.readline()
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        host.kill()
        host.wait()
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    started = time.monotonic()
    manager = asyncckpt.CheckpointManager(directory, process_group=dist.group.WORLD)
    assert time.monotonic() - started < 5, "the manager waited for the store"
    manager.save(1, {"w": torch.zeros(16)})
    manager.wait_until_finished()
    if ending == "closed":
        manager.close()
        dist.destroy_process_group()
    elif ending == "raising":
        raise SystemExit(3)
    """).replace("HOST", repr(textwrap.dedent("""
    import datetime, sys, time
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, True,
                          datetime.timedelta(seconds=60), wait_for_workers=False)
    print("up", flush=True)
    time.sleep(600)
    """)))


@pytest.mark.parametrize("ending,code", [("closed", 0), ("unclosed", 0), ("raising", 3),
                                         ("hostless", 0)])
def test_a_process_that_exits_while_its_heartbeat_beats_never_aborts(tmp_path, ending, code):
    # The reverted daemon beat (3f7c5b5) aborted each of the first three at its first exit with
    # SIGABRT, "terminate called without an active exception"; the exit's hook alone passes
    # them. A store whose host is gone delays neither the manager nor, beyond a failed
    # connection (about 15 s), the exit.
    for attempt in range(1 if ending == "hostless" else 3):  # each of these waits
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, ending, str(free_port()),
             str(tmp_path / f"ckpt{attempt}")],
            check=False, capture_output=True, text=True, timeout=120,
            env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert done.returncode == code, (attempt, done.returncode, done.stderr[-3000:])
        assert "terminate called" not in done.stderr, done.stderr[-3000:]
        assert time.monotonic() - started < 60, (attempt, done.stderr[-3000:])
