#!/usr/bin/env python3
"""torch.distributed.checkpoint (DCP) with its own storage against DCP with asyncckpt's, side by
side in one run, on the same FSDP2 state (issue 27).

    .venv/bin/python benchmarks/dcp_compare.py --build build --bench-dir /work/bench-tmp \
        --ranks 2 4 --gib 1

For each number of ranks it starts one torchrun job (gloo, CPU) whose ranks build the same
FSDP2 model (fully_shard on a CPU mesh; Linear layers, AdamW moments from one step on seeded
random gradients: --gib in all, a third parameters, two thirds moments, all random float32 that
compresses as little as a real run's) and take, in turn and --repeats times over:

  fs            dcp.save with FileSystemWriter (its defaults: one thread per rank)
  fs_threads4   dcp.save with FileSystemWriter(thread_count=4)
  fs_async      dcp.async_save with FileSystemWriter and DCP's default stager
  asyncckpt     dcp.async_save with asyncckpt.torch.StorageWriter and asyncckpt.torch.Stager

and reports per variant (the slowest rank's time, the median over repeats):

  blocked       time in dcp.save / dcp.async_save before the training loop has it back
  durable       time until the checkpoint is durable (the async future's result)
  load          dcp.load of that checkpoint into the state, page cache of its files dropped
                first (FileSystemReader for DCP's, asyncckpt.torch.StorageReader for ours)
  bytes         bytes on disk
  peak_rss      the largest rank's peak RSS during the save and load, above its RSS before

Writes benchmarks/results/dcp/dcp-compare.json and .md. Figures are reported, never asserted;
the targets (issue 27) are printed beside them.
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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_proc

VARIANTS = ("fs", "fs_threads4", "fs_async", "asyncckpt")
LAYER_WIDTH = 2048  # a Linear(2048, 2048) holds 16 MiB of parameters


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="CMake build tree (its python/)")
    parser.add_argument("--bench-dir", default="/work/bench-tmp", help="scratch directory")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--gib", type=float, default=1.0, help="state size in GiB, all ranks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/dcp", help="results directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---- one rank of the torchrun job ---------------------------------------------------------


def build_state(gib: float) -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers = max(1, round(gib * 1024 / 3 / 16))
    with torch.device("meta"):
        model = torch.nn.Sequential(*(torch.nn.Linear(LAYER_WIDTH, LAYER_WIDTH, bias=False)
                                      for _ in range(layers)))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(dist.get_rank())
    with torch.no_grad():
        for parameter in model.parameters():
            local = parameter.to_local()
            local.copy_(torch.randn(local.shape, generator=generator))
            # A seeded random gradient per shard, so that the step leaves AdamW's moments random
            # float32 (exp_avg = 0.1 g, exp_avg_sq = 0.001 g^2), as incompressible as a real
            # run's; zero gradients would leave two thirds of the state zeros.
            grad = torch.zeros_like(parameter)
            grad.to_local().copy_(torch.randn(local.shape, generator=generator) * 1e-3)
            parameter.grad = grad
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()  # the moments exist from here
    return model, optimizer


def time_variant(variant: str, state: dict[str, Any], directory: str) -> dict[str, float]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import asyncckpt.torch

    dist.barrier()
    baseline = bench_proc.status_kib("VmRSS")
    bench_proc.reset_peak_rss()
    start = time.perf_counter()
    if variant in ("fs", "fs_threads4"):
        writer = dcp.FileSystemWriter(directory, thread_count=4 if variant == "fs_threads4" else 1)
        dcp.save(state, storage_writer=writer)
        blocked = durable = time.perf_counter() - start
    elif variant == "fs_async":
        future = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(directory))
        blocked = time.perf_counter() - start
        future.result()
        durable = time.perf_counter() - start
    else:
        stager = asyncckpt.torch.Stager()
        future = dcp.async_save(state, storage_writer=asyncckpt.torch.StorageWriter(directory),
                                async_stager=stager)
        blocked = time.perf_counter() - start
        future.result()
        durable = time.perf_counter() - start
        stager.close()
    dist.barrier()
    bench_proc.drop_page_cache(directory)
    dist.barrier()
    reader = (asyncckpt.torch.StorageReader(directory) if variant == "asyncckpt"
              else dcp.FileSystemReader(directory))
    start = time.perf_counter()
    dcp.load(state, storage_reader=reader)
    load = time.perf_counter() - start
    peak = max(0, bench_proc.status_kib("VmHWM") - baseline) * 1024
    dist.barrier()
    return {"blocked": blocked, "durable": durable, "load": load, "peak_rss": float(peak)}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = build_state(args.gib)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for variant in VARIANTS:
            directory = os.path.join(args.bench_dir, f"{variant}-{repeat}")
            if rank == 0:
                shutil.rmtree(directory, ignore_errors=True)
            dist.barrier()
            figures = time_variant(variant, state, directory)
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, figures)
            if rank == 0:
                row = {key: max(g[key] for g in gathered) for key in figures}
                row.update(variant=variant, repeat=repeat,
                           bytes=bench_proc.bytes_on_disk(directory))
                rows.append(row)
                print(json.dumps(row), flush=True)
                shutil.rmtree(directory, ignore_errors=True)
            dist.barrier()
    del torch
    dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------


def run_job(args: argparse.Namespace, ranks: int) -> list[dict[str, Any]]:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    bench_dir = os.path.join(args.bench_dir, f"dcp-{ranks}")
    os.makedirs(bench_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    command = [torchrun, "--standalone", "--nproc_per_node", str(ranks), os.path.abspath(__file__),
               "--worker", "--gib", str(args.gib), "--repeats", str(args.repeats),
               "--bench-dir", bench_dir]
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"torchrun on {ranks} ranks failed:\n{done.stderr[-4000:]}")
    shutil.rmtree(bench_dir, ignore_errors=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    summary: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        mine = [row for row in rows if row["variant"] == variant]
        summary[variant] = {key: statistics.median(row[key] for row in mine)
                            for key in ("blocked", "durable", "load", "bytes", "peak_rss")}
    return summary


def targets(summary: dict[str, dict[str, float]]) -> list[tuple[str, float, str, bool]]:
    ours = summary["asyncckpt"]
    best_fs = min(summary["fs"]["durable"], summary["fs_threads4"]["durable"])
    checks = [
        ("durable / best FileSystemWriter", ours["durable"] / best_fs, "<= 0.5"),
        ("blocked / DCP async_save default", ours["blocked"] / summary["fs_async"]["blocked"],
         "<= 0.5"),
        ("load speed / FileSystemReader", summary["fs"]["load"] / ours["load"], ">= 1.2"),
        ("peak RSS / DCP's (async_save)", ours["peak_rss"] / max(summary["fs_async"]["peak_rss"],
                                                                  1.0), "<= 1.0"),
    ]
    return [(name, value, goal, value <= float(goal[3:]) if goal.startswith("<=")
             else value >= float(goal[3:])) for name, value, goal in checks]


def report(args: argparse.Namespace, results: dict[int, list[dict[str, Any]]]) -> str:
    lines = [(f"# DCP storage side by side ({args.gib} GiB FSDP2 state, {args.repeats} repeats, "
             f"medians of the slowest rank)"), "",
             (f"`.venv/bin/python benchmarks/dcp_compare.py --ranks {' '.join(map(str, args.ranks))}"
             f" --gib {args.gib} --repeats {args.repeats}`, {platform.node()}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load "
             f"{os.getloadavg()[0]:.2f}"), ""]
    for ranks, rows in results.items():
        summary = summarize(rows)
        lines += [f"## {ranks} ranks", "",
                  "| variant | blocked s | durable s | load s | bytes on disk | peak RSS MiB |",
                  "|---|---|---|---|---|---|"]
        for variant, figures in summary.items():
            lines.append(f"| {variant} | {figures['blocked']:.3f} | {figures['durable']:.3f} | "
                         f"{figures['load']:.3f} | {int(figures['bytes'])} | "
                         f"{figures['peak_rss'] / 2**20:.0f} |")
        lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
        lines += [f"| {name} | {value:.2f} | {goal} | {'yes' if met else 'no'} |"
                  for name, value, goal, met in targets(summary)]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    results = {ranks: run_job(args, ranks) for ranks in args.ranks}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dcp-compare.json"), "w") as out:
        json.dump({"args": vars(args), "rows": {str(k): v for k, v in results.items()}}, out,
                  indent=1)
    text = report(args, results)
    with open(os.path.join(args.out, "dcp-compare.md"), "w") as out:
        out.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
