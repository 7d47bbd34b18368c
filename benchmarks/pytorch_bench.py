#!/usr/bin/env python3
"""Checkpointing inside a real PyTorch training loop, five ways side by side in one process.

The loop trains a wide MLP (by default 512 MiB of float32 parameters, so 1.5 GiB of state with
Adam's two moments) on the synthetic 8x8 digits of examples/pytorch_train.py and saves every
--save-every steps:

  none             no checkpointing (the yardstick for step times)
  torch.save       torch.save of the state dict + os.fsync, on the training thread
  dcp-style        clone the state dict on the training thread, torch.save + fsync in a thread
                   (torch.distributed.checkpoint.async_save's shape: the next save waits for it)
  asyncckpt-sync   asyncckpt.CheckpointManager(asynchronous=False)
  asyncckpt-async  asyncckpt.CheckpointManager() (the snapshot copy only, the rest in background)

Per variant: training-thread blocked seconds per save, step time p50 / p99 and their ratio to
`none`, time until the save is durable, bytes on disk per checkpoint, and peak RSS (VmHWM, reset
before each variant). Writes benchmarks/results/pytorch_bench-<time>.{json,md} and prints the
markdown table. Not a test: timings depend on the machine; run it on a quiet one.

    PYTHONPATH=build/python .venv/bin/python benchmarks/pytorch_bench.py
    PYTHONPATH=build/python .venv/bin/python benchmarks/pytorch_bench.py --param-mib 32 \\
        --width 1024 --steps 20 --save-every 5      # a small run that proves it works
"""

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time

import numpy as np
import torch

import asyncckpt

# The training data is the example's: one generator of it, in the program users copy.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from pytorch_train import synthetic_digits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_proc

VARIANTS = ["none", "torch.save", "dcp-style", "asyncckpt-sync", "asyncckpt-async"]
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--param-mib", type=float, default=512, help="MiB of float32 parameters")
    parser.add_argument("--width", type=int, default=4096, help="width of the hidden layers")
    parser.add_argument("--steps", type=int, default=60, help="measured steps per variant")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps before the variants")
    parser.add_argument("--save-every", type=int, default=10, help="save every N steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--compression", default="shuffle+zstd", help="asyncckpt's codec")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--dir", default="/var/tmp/asyncckpt-pytorch-bench",
                        help="scratch directory for checkpoints (a real disk, not tmpfs)")
    parser.add_argument("--out", default=RESULTS_DIR, help="where the JSON and markdown go")
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    return args


# ---- the training job -------------------------------------------------------------------------

def build_model(param_bytes, width):
    """A ReLU MLP 64 -> width x layers -> 10 with about param_bytes of float32 parameters."""
    hidden_layers = max(1, round(param_bytes / 4 / (width * width)))
    layers = [torch.nn.Linear(64, width), torch.nn.ReLU()]
    for _ in range(hidden_layers):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


class Job:
    def __init__(self, args):
        torch.manual_seed(0)
        images, labels = synthetic_digits(seed=0)
        self.x = torch.from_numpy(images.reshape(len(images), 64))
        self.y = torch.from_numpy(labels)
        self.model = build_model(args.param_mib * 2**20, args.width)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.batch_size = args.batch_size
        self.generator = torch.Generator().manual_seed(0)

    def step(self):
        batch = torch.randint(0, len(self.y), (self.batch_size,), generator=self.generator)
        loss = torch.nn.functional.cross_entropy(self.model(self.x[batch]), self.y[batch])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def state(self, step):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "step": step}

    def state_bytes(self):
        total = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        for entry in self.optimizer.state_dict()["state"].values():
            total += sum(t.numel() * t.element_size() for t in entry.values()
                         if isinstance(t, torch.Tensor))
        return total


# ---- the ways to save -------------------------------------------------------------------------

def torch_save_durably(state, directory, step):
    """torch.save to a temporary name, fsync, rename, fsync the directory, drop the previous."""
    final = os.path.join(directory, f"ckpt-{step}.pt")
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    bench_proc.fsync_path(directory)
    for name in os.listdir(directory):
        if name.endswith(".pt") and name != os.path.basename(final):
            os.remove(os.path.join(directory, name))
    return final


def clone_state(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_state(v) for v in value)
    return value


class NoSaver:
    def save(self, step, job):
        return None

    def finish(self):
        pass

    def bytes_on_disk(self):
        return 0


class TorchSaver(NoSaver):
    def __init__(self, directory):
        self.directory = directory
        self.durable = []
        self.path = None

    def save(self, step, job):
        start = time.perf_counter()
        self.path = torch_save_durably(job.state(step), self.directory, step)
        self.durable.append(time.perf_counter() - start)

    def bytes_on_disk(self):
        return os.path.getsize(self.path) if self.path else 0


class DcpStyleSaver(TorchSaver):
    """Clone on the training thread; the next save waits for the previous write."""

    def __init__(self, directory):
        super().__init__(directory)
        self.thread = None

    def save(self, step, job):
        start = time.perf_counter()
        self.finish()
        snapshot = clone_state(job.state(step))

        def write():
            self.path = torch_save_durably(snapshot, self.directory, step)
            self.durable.append(time.perf_counter() - start)

        self.thread = threading.Thread(target=write)
        self.thread.start()

    def finish(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None


class AsyncckptSaver(NoSaver):
    def __init__(self, directory, asynchronous, compression):
        self.manager = asyncckpt.CheckpointManager(directory, max_to_keep=1,
                                                   asynchronous=asynchronous,
                                                   compression=compression)

    def save(self, step, job):
        self.manager.save(step, job.state(step))

    def finish(self):
        self.manager.close()

    @property
    def durable(self):
        return [s.seconds_to_durable for s in self.manager.stats().saves]

    def bytes_on_disk(self):
        step = self.manager.latest_step()
        if step is None:
            return 0
        path = self.manager.checkpoint_path(step)
        return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))


def make_saver(variant, directory, args):
    if variant == "none":
        return NoSaver()
    if variant == "torch.save":
        return TorchSaver(directory)
    if variant == "dcp-style":
        return DcpStyleSaver(directory)
    return AsyncckptSaver(directory, variant == "asyncckpt-async", args.compression)


# ---- measuring --------------------------------------------------------------------------------

def percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def run_variant(variant, job, args, first_step):
    directory = os.path.join(args.dir, variant)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    gc.collect()
    rss_reset = bench_proc.reset_peak_rss()
    saver = make_saver(variant, directory, args)
    step_seconds, blocked = [], []
    for i in range(1, args.steps + 1):
        step = first_step + i
        start = time.perf_counter()
        job.step()
        if variant != "none" and i % args.save_every == 0:
            save_start = time.perf_counter()
            saver.save(step, job)
            blocked.append(time.perf_counter() - save_start)
        step_seconds.append(time.perf_counter() - start)
    finish_start = time.perf_counter()
    saver.finish()
    finish_seconds = time.perf_counter() - finish_start
    durable = list(saver.durable) if variant != "none" else []
    result = {
        "variant": variant,
        "saves": len(blocked),
        "blocked_seconds": blocked,
        "blocked_median": statistics.median(blocked) if blocked else 0.0,
        "blocked_max": max(blocked) if blocked else 0.0,
        "step_seconds": step_seconds,
        "step_p50": percentile(step_seconds, 50),
        "step_p99": percentile(step_seconds, 99),
        "durable_seconds": durable,
        "durable_median": statistics.median(durable) if durable else 0.0,
        "final_wait_seconds": finish_seconds,
        "bytes_on_disk": saver.bytes_on_disk(),
        "peak_rss_bytes": bench_proc.status_kib("VmHWM") * 1024 if rss_reset else None,
    }
    del saver
    gc.collect()
    shutil.rmtree(directory, ignore_errors=True)
    return result


def gib(value):
    return f"{value / 2**30:.2f}"


def markdown(results, meta):
    none = next((r for r in results if r["variant"] == "none"), None)
    lines = [
        (f"State: {gib(meta['state_bytes'])} GiB ({meta['parameter_bytes'] / 2**20:.0f} MiB of "
         f"parameters + Adam), {meta['steps']} steps per variant, a save every "
         f"{meta['save_every']} steps; {meta['machine']}."),
        "",
        ("| variant | blocked s/save (median / max) | step p50 s (vs none) | step p99 s (vs none) "
         "| to durable s (median) | bytes on disk | peak RSS GiB |"),
        "|---|---|---|---|---|---|---|",
    ]
    def ratio(r, key):
        return f" ({r[key] / none[key]:.3f}x)" if none and none[key] > 0 else ""

    for r in results:
        blocked = (f"{r['blocked_median']:.4f} / {r['blocked_max']:.4f}" if r["saves"] else "-")
        durable = f"{r['durable_median']:.3f}" if r["durable_seconds"] else "-"
        rss = gib(r["peak_rss_bytes"]) if r["peak_rss_bytes"] is not None else "n/a"
        on_disk = f"{r['bytes_on_disk'] / 2**30:.3f} GiB" if r["bytes_on_disk"] else "-"
        lines.append(f"| {r['variant']} | {blocked} | {r['step_p50']:.4f}{ratio(r, 'step_p50')} | "
                     f"{r['step_p99']:.4f}{ratio(r, 'step_p99')} | {durable} | {on_disk} | {rss} |")
    by_name = {r["variant"]: r for r in results}
    ours = by_name.get("asyncckpt-async")
    if ours and ours["blocked_median"] > 0:
        lines.append("")
        for other in ("torch.save", "dcp-style"):
            if other in by_name:
                factor = by_name[other]["blocked_median"] / ours["blocked_median"]
                lines.append(f"- asyncckpt-async blocks {factor:.1f}x less than {other} per "
                             "save (target: >= 20x below torch.save, below dcp-style).")
        if none:
            factor = ours["step_p50"] / none["step_p50"]
            lines.append(f"- asyncckpt-async step p50 is {factor:.3f}x that of no "
                         "checkpointing (target: within 1.02x).")
    return "\n".join(lines) + "\n"


def main(argv):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    job = Job(args)
    for _ in range(args.warmup_steps):  # creates Adam's moments
        job.step()
    meta = {
        "parameter_bytes": sum(p.numel() * 4 for p in job.model.parameters()),
        "state_bytes": job.state_bytes(),
        "steps": args.steps,
        "save_every": args.save_every,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "compression": args.compression,
        "torch": torch.__version__,
        "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    print(f"state: {gib(meta['state_bytes'])} GiB; torch threads {meta['torch_threads']}",
          flush=True)
    results = []
    step = args.warmup_steps
    for variant in args.variants.split(","):
        print(f"running {variant} ...", flush=True)
        results.append(run_variant(variant, job, args, step))
        step += args.steps
    table = markdown(results, meta)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(args.out, f"pytorch_bench-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(table)
    print(f"wrote {base}.json and {base}.md")


if __name__ == "__main__":
    main(sys.argv[1:])
