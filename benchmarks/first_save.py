"""The Python manager's first save against its later ones, by the wall clock, with and without
CheckpointManager.prepare. Usage (from the repository root, after building _core):

    PYTHONPATH=build/python .venv/bin/python benchmarks/first_save.py [--mib 512] [--saves 6]
"""

import argparse
import tempfile
import time

import numpy as np

import asyncckpt


def run(state, saves, prepare):
    """Wall-clock seconds of each save, blocked_seconds of each, and the start-up cost."""
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        manager = asyncckpt.CheckpointManager(directory, max_to_keep=2)
        if prepare:
            manager.prepare(state)
        walls = []
        for step in range(saves):
            start = time.perf_counter()
            manager.save(step, state)
            walls.append(time.perf_counter() - start)
            manager.wait_until_finished()
        manager.close()
        stats = manager.stats()
    return walls, [s.blocked_seconds for s in stats.saves], stats.startup_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="state size in MiB (8 tensors)")
    parser.add_argument("--saves", type=int, default=6)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    elements = (args.mib << 20) // 8 // 4
    state = {f"w{i}": rng.standard_normal(elements, dtype=np.float32) for i in range(8)}
    for prepare in (False, True):
        walls, blocked, startup = run(state, args.saves, prepare)
        steady = float(np.median(walls[1:]))
        print(f"prepare={prepare!s:5} first {walls[0]:.3f} s, steady median {steady:.3f} s, "
              f"first/steady {walls[0] / steady:.2f} (wall clock); blocked_seconds first "
              f"{blocked[0]:.3f} s; start-up {startup:.3f} s")


if __name__ == "__main__":
    main()
