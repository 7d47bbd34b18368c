#!/usr/bin/env python3
"""asyncckpt.load (new tensors, as torch.load makes) against CheckpointManager.restore into
tensors that exist, side by side and alternating in one process (issue 32 item 5).

    PYTHONPATH=build/python .venv/bin/python benchmarks/load_vs_restore.py --size 2GiB \
        --rounds 5 --dir /work/bench-load --cold --out benchmarks/results/load/load-2GiB.md

Saves one checkpoint of --tensors torch float32 tensors, --size in all, then takes in each
round, in an order that rotates from round to round:

  restore           manager.restore(state) into the tensors of a state that holds its pages
  load              asyncckpt.load(checkpoint): new tensors, their pages faulted in ahead of
                    the reader, the reads in batches
  load_in_reader    (--with-reader-faults) the same load with the faults left to the reader,
                    as before issue 32: one read_into, the kernel faulting every page as it
                    registers the destinations

--cold drops the page cache before each timed call (all of it as root, else the checkpoint's
files); with O_DIRECT reads (the default) the data files never enter the page cache, so both
modes read them from the disk and --cold drops the index and what else is cached. Prints every round and the medians, and load's median over restore's: the target is
load <= 1.25 x restore. The first load is checked bit for bit against the restored state.
Figures are reported, never asserted; the 1-minute load average is printed beside each.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_proc

TARGET = 1.25  # load time / restore time at most (issue 32: load at >= 0.8x restore's speed)
UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
         "g": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of "2GiB", "512MiB", "1.5g" or a plain number of bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 2GiB or 512MiB")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("2GiB"),
                        help="state size (2GiB, 512MiB, ...)")
    parser.add_argument("--tensors", type=int, default=16, help="float32 tensors in the state")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/work/bench-tmp", help="scratch directory")
    parser.add_argument("--compression", default=None,
                        help="the manager's compression (default: the manager's default)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each")
    parser.add_argument("--with-reader-faults", action="store_true",
                        help="also time load with its page faults left to the reader")
    parser.add_argument("--out", default=None, help="write a Markdown report here")
    args = parser.parse_args(argv)
    if args.tensors < 1 or args.rounds < 1 or args.size < args.tensors * 4:
        parser.error("--tensors and --rounds must be >= 1, --size at least 4 bytes a tensor")
    return args


def drop_cache(checkpoint: str) -> str:
    """Drops the page cache: all of it where this process may (root), else the checkpoint's
    files. Returns which."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as caches:
            caches.write("3")
        return "drop_caches"
    except OSError:
        bench_proc.drop_page_cache(checkpoint)
        return "fadvise"


def make_checkpoint(args: argparse.Namespace, directory: str) -> tuple[str, dict[str, Any]]:
    """Saves the state once; returns the checkpoint's path and a state of the same shapes."""
    import torch

    import asyncckpt

    elements = args.size // 4 // args.tensors
    generator = torch.Generator().manual_seed(0)
    state = {f"t{i:03d}": torch.randn(elements, generator=generator)
             for i in range(args.tensors)}
    options = {} if args.compression is None else {"compression": args.compression}
    with asyncckpt.CheckpointManager(directory, asynchronous=False, **options) as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    for tensor in state.values():
        tensor.zero_()  # restore must change every byte; the pages stay faulted in
    return path, state


def timed(variant: str, manager: Any, path: str, state: dict[str, Any]) -> tuple[float, Any]:
    import asyncckpt
    from asyncckpt import _prefault

    start = time.perf_counter()
    if variant == "restore":
        manager.restore(state)
        return time.perf_counter() - start, None
    if variant == "load":
        loaded = asyncckpt.load(path)
        return time.perf_counter() - start, loaded
    madvise = _prefault._libc_madvise
    _prefault._libc_madvise = lambda: None  # the path before issue 32: the reader faults
    try:
        start = time.perf_counter()
        loaded = asyncckpt.load(path)
        return time.perf_counter() - start, loaded
    finally:
        _prefault._libc_madvise = madvise


def run(args: argparse.Namespace) -> tuple[list[dict[str, float]], str]:
    import torch

    import asyncckpt

    directory = os.path.join(args.dir, "load-vs-restore")
    shutil.rmtree(directory, ignore_errors=True)
    path, state = make_checkpoint(args, directory)
    variants = ["restore", "load"] + (["load_in_reader"] if args.with_reader_faults else [])
    manager = asyncckpt.CheckpointManager(directory)
    rows: list[dict[str, float]] = []
    dropped = "none (warm)"
    checked = False
    try:
        for round_ in range(args.rounds):
            shift = round_ % len(variants)
            row: dict[str, float] = {}
            for variant in variants[shift:] + variants[:shift]:
                if args.cold:
                    dropped = drop_cache(path)
                seconds, loaded = timed(variant, manager, path, state)
                row[variant] = seconds
                row[f"{variant}_loadavg"] = os.getloadavg()[0]
                if loaded is not None and not checked and "restore" in row:
                    for name, tensor in state.items():
                        if not torch.equal(tensor.view(torch.int32),
                                           loaded[name].view(torch.int32)):
                            raise SystemExit(f"load and restore disagree on {name}")
                    checked = True
                del loaded
            rows.append(row)
            print(f"round {round_}: " + "  ".join(
                f"{v} {row[v]:.3f} s (load avg {row[v + '_loadavg']:.2f})" for v in variants)
                + f"  load/restore {row['load'] / row['restore']:.2f}", flush=True)
    finally:
        manager.close()
        shutil.rmtree(directory, ignore_errors=True)
    return rows, dropped


def machine() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as thp:
            huge = thp.read().strip()
    except OSError:
        huge = "n/a"
    return (f"{platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"transparent huge pages: {huge}")


def report(args: argparse.Namespace, argv: list[str], rows: list[dict[str, float]],
           dropped: str, started_loadavg: float) -> str:
    variants = [v for v in ("restore", "load", "load_in_reader") if v in rows[0]]
    medians = {v: statistics.median(row[v] for row in rows) for v in variants}
    gib = args.size / (1 << 30)
    lines = [(f"# load() against restore() ({gib:g} GiB, {args.tensors} float32 tensors, "
             f"{args.rounds} rounds, {'cold' if args.cold else 'warm'} cache)"), "",
             f"`.venv/bin/python benchmarks/load_vs_restore.py {' '.join(argv)}`", "",
             (f"{machine()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"load average (1 min) {started_loadavg:.2f} at the start, "
             f"{os.getloadavg()[0]:.2f} at the end; page cache dropped by: {dropped}; "
             f"compression: {args.compression or 'the default'}"), "",
             "| round | " + " | ".join(f"{v} s (load avg)" for v in variants)
             + " | load / restore |", "|---" * (len(variants) + 2) + "|"]
    for index, row in enumerate(rows):
        lines.append(f"| {index} | " + " | ".join(
            f"{row[v]:.3f} ({row[v + '_loadavg']:.2f})" for v in variants)
            + f" | {row['load'] / row['restore']:.2f} |")
    lines.append("| median | " + " | ".join(f"{medians[v]:.3f}" for v in variants)
                 + f" | {medians['load'] / medians['restore']:.2f} |")
    ratio = medians["load"] / medians["restore"]
    lines += ["", (f"load / restore (medians): {ratio:.2f}, target <= {TARGET} "
              f"({'met' if ratio <= TARGET else 'not met'})")]
    if "load_in_reader" in medians:
        lines.append(f"load with the faults left to the reader / restore (medians): "
                     f"{medians['load_in_reader'] / medians['restore']:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    started = os.getloadavg()[0]
    rows, dropped = run(args)
    text = report(args, argv, rows, dropped, started)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
