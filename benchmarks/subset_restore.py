#!/usr/bin/env python3
"""A subset restore against a full restore of the same checkpoint: bytes read (the reader's own
counters) and time, side by side in one run (issue 32, item 2).

    PYTHONPATH=build/python .venv/bin/python benchmarks/subset_restore.py --gib 1 --share 0.1

Saves one checkpoint of --gib GiB (uncompressed, so bytes read equal bytes asked for): a
"model" of --share of the bytes and an "optimizer" of the rest, 40 float32 tensors in all. Then,
--rounds times, restores everything and then the model alone into existing tensors, each after
dropping the page cache when run as root. Prints bytes read and seconds per round and their
ratios; asserts only that the subset came back bit-exact.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import torch

import asyncckpt
from asyncckpt import _core
from asyncckpt import manager as manager_module

TENSORS = 40
MIB = 1 << 20


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="checkpoint size in GiB")
    parser.add_argument("--share", type=float, default=0.1, help="the subset's share of bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/work/bench-tmp/subset-restore", help="scratch dir")
    return parser.parse_args(argv)


def make_state(gib: float, share: float) -> dict[str, dict[str, torch.Tensor]]:
    """A model of round(share * TENSORS) tensors and an optimizer of the others, equal sizes."""
    model_tensors = max(1, round(share * TENSORS))
    elements = int(gib * (1 << 30)) // (4 * TENSORS)
    return {"model": {f"w{i}": torch.randn(elements) for i in range(model_tensors)},
            "optimizer": {f"m{i}": torch.randn(elements)
                          for i in range(TENSORS - model_tensors)}}


def drop_page_cache() -> None:
    """Cold reads when root; warm ones (said in the output) otherwise."""
    if os.geteuid() == 0:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as caches:
            caches.write("3\n")


def timed_restore(path: str, template: dict[str, dict[str, torch.Tensor]]) -> tuple[float, int]:
    """(seconds, bytes read) of the manager's restore path into ``template``."""
    drop_page_cache()
    reader = _core.open_reader(path)
    start = time.perf_counter()
    manager_module._restore_from(reader, template)
    return time.perf_counter() - start, int(reader.read_stats()["bytes_read"])


def empty_like(state: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    return {group: {name: torch.empty_like(t) for name, t in tensors.items()}
            for group, tensors in state.items()}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    state = make_state(args.gib, args.share)
    with asyncckpt.CheckpointManager(args.dir, compression="none") as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    full, subset = empty_like(state), empty_like({"model": state["model"]})
    cache = "cold" if os.geteuid() == 0 else "warm (not root: page cache kept)"
    print(f"checkpoint {args.gib:g} GiB, subset share {args.share:g}, {cache} cache, "
          f"load {os.getloadavg()[0]:.2f}")
    print("| round | full MiB | full s | subset MiB | subset s | bytes ratio | time ratio |")
    print("|---|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        full_s, full_bytes = timed_restore(path, full)
        subset_s, subset_bytes = timed_restore(path, subset)
        print(f"| {round_} | {full_bytes / MIB:.1f} | {full_s:.2f} | {subset_bytes / MIB:.1f} | "
              f"{subset_s:.2f} | {subset_bytes / full_bytes:.3f} | {subset_s / full_s:.3f} |")
    for name, tensor in state["model"].items():
        assert torch.equal(subset["model"][name], tensor), name
    shutil.rmtree(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
