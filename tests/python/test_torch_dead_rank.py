# ctest-labels: torchrun
"""A rank of a torch.distributed job that dies between saves fails the survivors' next save at
once with an error that names it (and no healthy rank), as the MPI mode does: three gloo ranks
spawned here, rank 2 killed after the first save."""

from __future__ import annotations

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import asyncckpt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WORLD = 3
DEAD = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_main(rank: int, directory: str, port: int, report: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    manager = asyncckpt.CheckpointManager(directory)
    state = {"w": torch.full((1024,), float(rank))}
    manager.save(1, state)
    manager.wait_until_finished()
    if rank == DEAD:
        os._exit(9)  # as SIGKILL would: no clean-up, no goodbye
    time.sleep(1)
    started = time.monotonic()
    try:
        manager.save(2, state)
        manager.wait_until_finished()
        outcome = "no error"
    except Exception as error:  # noqa: BLE001 - reported to the test
        outcome = f"{type(error).__name__}: {error}"
    with open(f"{report}.{rank}", "w") as out:
        out.write(f"{time.monotonic() - started:.1f}\n{outcome}")
    os._exit(0)  # the process group cannot be destroyed without the dead rank


def test_a_dead_rank_fails_the_survivors_next_save_naming_it(tmp_path):
    report = str(tmp_path / "report")
    context = mp.get_context("spawn")
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(r, str(tmp_path / "ckpt"), port, report))
             for r in range(WORLD)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(180)
    assert [p.exitcode for p in ranks] == [0, 0, 9], "a rank hung or failed on its own"
    for rank in range(WORLD):
        if rank == DEAD:
            continue
        with open(f"{report}.{rank}") as reported:
            seconds, outcome = reported.read().split("\n", 1)
        assert f"rank {DEAD} of the job stopped answering" in outcome, (rank, outcome)
        assert "ranks" not in outcome.split("stopped answering")[0], outcome  # no healthy rank
        assert float(seconds) < 30, (rank, seconds, outcome)
    # The checkpoint every rank committed before the death is whole.
    assert asyncckpt.CheckpointManager(tmp_path / "ckpt").all_steps() == [1]
