#!/usr/bin/env python3
"""The Python manager's first save against its later ones, fresh and resumed, with and without
CheckpointManager.prepare, beside the yardsticks of the same run: faulting in as much fresh
memory as the state, and one memcpy of the state (issue 32, item 0). From the repository root,
after building _core:

    PYTHONPATH=build/python .venv/bin/python benchmarks/first_save.py --mib 512 2048

For each size and case, one manager (save_interval_steps=1, asynchronous) saves --saves times,
waiting for each to be durable; the first save's time by the wall clock of the save call is
compared with the median of the later ones (steady), and with fault-in + memcpy; the engine's
set-up (SaverTotals.startup_seconds: staging allocated, faulted in and registered, on whichever
thread made it) with fault-in alone. Cases:

  fresh              a new directory, save at once
  fresh+prepare      a new directory, prepare(state) (its own time is the "call" column), then
                     --gap seconds of training (a sleep), then the saves
  resumed            a directory holding a checkpoint of the state: the manager (which starts
                     preparing staging like that checkpoint in the background), restore(state),
                     --gap seconds of training, then the saves
  resumed, no gap    the same, saving right after restore

The gap stands for the steps a job trains between its start and its first save. Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import time

import numpy as np

import asyncckpt

TENSORS = 8


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[512, 2048], help="state sizes")
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--gap", type=float, default=None,
                        help="seconds of training before the first save (default 4 s per GiB)")
    parser.add_argument("--dir", default="/work/bench-tmp/first-save", help="scratch directory")
    return parser.parse_args(argv)


def make_state(mib: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    elements = (mib << 20) // TENSORS // 4
    return {f"w{i}": rng.standard_normal(elements, dtype=np.float32) for i in range(TENSORS)}


def yardsticks(nbytes: int, state: dict[str, np.ndarray]) -> tuple[float, float]:
    """The fastest of three (seconds to fault in nbytes of fresh memory, seconds of one memcpy of
    the state): the stricter yardstick on a machine whose speed drifts."""
    runs = [one_yardstick(nbytes, state) for _ in range(3)]
    return min(fault for fault, _ in runs), min(copy for _, copy in runs)


def one_yardstick(nbytes: int, state: dict[str, np.ndarray]) -> tuple[float, float]:
    # A mapping of its own: malloc may hand back pages a freed array left resident.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    fresh = np.frombuffer(mapping, dtype=np.uint8)
    start = time.perf_counter()
    fresh[::4096] = 1
    fault = time.perf_counter() - start
    offset = 0
    start = time.perf_counter()
    for array in state.values():
        view = fresh[offset:offset + array.nbytes].view(array.dtype)
        np.copyto(view, array)
        offset += array.nbytes
    copy = time.perf_counter() - start
    del fresh, view
    mapping.close()
    return fault, copy


def run_case(directory: str, state: dict[str, np.ndarray], case: str, saves: int,
             gap: float) -> tuple[float, list[float], float]:
    """(seconds of the manager's construction and the call before the saves, wall seconds of
    each save call, seconds of the engine's and staging's set-up wherever it ran)."""
    resumed = case.startswith("resumed")
    if not resumed:
        shutil.rmtree(directory, ignore_errors=True)
    start = time.perf_counter()
    manager = asyncckpt.CheckpointManager(directory, save_interval_steps=1, max_to_keep=2)
    if resumed:
        first_step = manager.restore(state)
        assert first_step is not None, "nothing to resume from"
        first_step += 1
    else:
        first_step = 0
        if case == "fresh+prepare":
            manager.prepare(state)
    call = time.perf_counter() - start
    if case in ("fresh+prepare", "resumed"):
        time.sleep(gap)
    walls = []
    for step in range(first_step, first_step + saves):
        start = time.perf_counter()
        manager.save(step, state)
        walls.append(time.perf_counter() - start)
        manager.wait_until_finished()
    manager.close()
    return call, walls, manager.stats().startup_seconds


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print("| MiB | case | call s | first s | steady s | first/steady | fault+memcpy s | "
          "first/(fault+memcpy) | set-up s | set-up/fault |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mib in args.mib:
        state = make_state(mib)
        gap = args.gap if args.gap is not None else 4.0 * mib / 1024
        fault, copy = yardsticks(mib << 20, state)
        directory = os.path.join(args.dir, f"{mib}")
        for case in ("fresh", "fresh+prepare", "resumed", "resumed, no gap"):
            call, walls, setup = run_case(directory, state, case, args.saves, gap)
            steady = statistics.median(walls[1:])
            print(f"| {mib} | {case} | {call:.3f} | {walls[0]:.3f} | {steady:.3f} | "
                  f"{walls[0] / steady:.2f} | {fault + copy:.3f} | "
                  f"{walls[0] / (fault + copy):.2f} | {setup:.3f} | {setup / fault:.2f} |",
                  flush=True)
        shutil.rmtree(directory, ignore_errors=True)
    print(f"gap: {'4 s per GiB' if args.gap is None else f'{args.gap} s'} of sleep before the "
          "first save in the fresh+prepare and resumed cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
