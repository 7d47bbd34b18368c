#!/usr/bin/env python3
"""`asyncckpt export --format safetensors` against the time to read the checkpoint plus the
time to write as many bytes with fio, side by side in one run (issue 29: export of 4 GiB at most
1.2x that sum). From the repository root, after building the CLI and _core:

    PYTHONPATH=build/python .venv/bin/python benchmarks/export_bench.py --size 4GiB \
        --rounds 3 --dir /work/bench-export --out benchmarks/results/export/export-4GiB.md

Saves one checkpoint of --tensors float32 tensors of random values (--size in all, default
compression), then in each round, in an order that rotates from round to round, with the page
cache dropped before each:

  export   build/bin/asyncckpt export --format safetensors CHECKPOINT OUT (every chunk verified,
           the files written and fsynced), OUT removed afterwards
  read     every file of the checkpoint read once, 8 MiB at a time (no verification)
  write    fio writing a new file of the checkpoint's raw bytes, buffered as export writes,
           --fallocate=none, fsync at the end

Prints every round, the medians and export / (read + write). Figures are reported, never
asserted; the 1-minute load average is printed beside each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
READ_PIECE = 8 << 20


def parse_size(text: str) -> int:
    """'4GiB' and the like, or plain bytes."""
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=4 << 30)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", required=True, help="where the checkpoint and exports go")
    parser.add_argument("--cli", default="build/bin/asyncckpt")
    parser.add_argument("--out", help="markdown file to write the table to")
    return parser.parse_args(argv)


def drop_cache() -> None:
    """Drops the whole page cache (root); the benchmark's figures are cold reads otherwise not."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3")


def make_checkpoint(args: argparse.Namespace) -> str:
    """Saves random float32 tensors once; returns the checkpoint's path."""
    import asyncckpt

    directory = os.path.join(args.dir, "checkpoints")
    shutil.rmtree(directory, ignore_errors=True)
    generator = np.random.default_rng(0)
    elements = args.size // 4 // args.tensors
    state = {f"layer{i:02d}.weight": generator.standard_normal(elements, dtype=np.float32)
             for i in range(args.tensors)}
    with asyncckpt.CheckpointManager(directory, asynchronous=False) as manager:
        manager.save(1, state)
        return manager.checkpoint_path(1)


def time_export(args: argparse.Namespace, checkpoint: str) -> float:
    out = os.path.join(args.dir, "exported")
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([args.cli, "export", "--format", "safetensors", checkpoint, out],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(out)
    return seconds


def time_read(checkpoint: str) -> float:
    buffer = bytearray(READ_PIECE)
    start = time.perf_counter()
    for root, _, files in os.walk(checkpoint):
        for name in files:
            with open(os.path.join(root, name), "rb", buffering=0) as file:
                while file.readinto(buffer):
                    pass
    return time.perf_counter() - start


def time_write(args: argparse.Namespace, raw_bytes: int) -> float:
    target = os.path.join(args.dir, "fio.dat")
    command = ["fio", "--name=export-limit", f"--filename={target}", "--rw=write", "--bs=1M",
               "--direct=0", "--ioengine=psync", f"--size={raw_bytes}", "--end_fsync=1",
               "--fallocate=none", "--output-format=json"]
    start = time.perf_counter()
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    os.remove(target)
    json.loads(result.stdout[result.stdout.index("{"):])  # fio ran and reported
    return seconds


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if shutil.which("fio") is None:
        print("export_bench: needs fio (apt-get install fio)", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    checkpoint = make_checkpoint(args)
    raw_bytes = args.size // 4 // args.tensors * 4 * args.tensors
    runs = {"export": lambda: time_export(args, checkpoint), "read": lambda: time_read(checkpoint),
            "write": lambda: time_write(args, raw_bytes)}
    names = list(runs)
    figures: dict[str, list[float]] = {name: [] for name in names}
    lines = [(f"# safetensors export against read + write ({args.size / (1 << 30):g} GiB, "
             f"{args.tensors} float32 tensors, {args.rounds} rounds, cold cache)"), "",
             f"`{' '.join(['.venv/bin/python', 'benchmarks/export_bench.py'] + argv)}`", "",
             (f"{platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"), "",
             ("| round | export s (load avg) | read s (load avg) | write s (load avg) | "
             "export / (read + write) |"), "|---|---|---|---|---|"]
    for round_index in range(args.rounds):
        cells = {}
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            drop_cache()
            seconds = runs[name]()
            figures[name].append(seconds)
            cells[name] = f"{seconds:.3f} ({os.getloadavg()[0]:.2f})"
        ratio = figures["export"][-1] / (figures["read"][-1] + figures["write"][-1])
        lines.append(f"| {round_index} | {cells['export']} | {cells['read']} | {cells['write']} "
                     f"| {ratio:.2f} |")
        print(lines[-1], flush=True)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    ratio = medians["export"] / (medians["read"] + medians["write"])
    lines.append(f"| median | {medians['export']:.3f} | {medians['read']:.3f} | "
                 f"{medians['write']:.3f} | {ratio:.2f} |")
    lines += ["", (f"export / (read + write) (medians): {ratio:.2f}, target <= 1.2 "
              f"({'met' if ratio <= 1.2 else 'not met'})")]
    print("\n".join(lines[-3:]))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")
    shutil.rmtree(os.path.join(args.dir, "checkpoints"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
