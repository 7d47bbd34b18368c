#!/usr/bin/env python3
"""Orbax's StandardCheckpointer against asyncckpt's JAX manager and asyncckpt through the Orbax
handler, side by side in one run, on the same sharded pytree (1 GiB of float32 by default, on a
Mesh of 8 CPU devices).

    PYTHONPATH=build/python .venv/bin/python benchmarks/jax_compare.py

Each variant runs in a child process of its own (so its peak RSS is its own), which makes the
same seeded pytree, then saves it --repeats times with one checkpointer (the first save pays
for its set-up, the median does not) and restores each save onto a target of ShapeDtypeStructs with the same shardings. Figures per variant (medians
over the repeats): seconds blocked in save (the call's return), seconds to durable (from the
call until the variant says the checkpoint is complete: Orbax's wait_until_finished, the save
future's result, the handler's commit), restore seconds (until every array is ready), bytes on
disk, and the child's peak RSS beside its RSS with the pytree alone. Restores read what the
save just wrote: Orbax's files may still sit in the page cache, asyncckpt's O_DIRECT writes do
not. Writes benchmarks/results/jax/jax_compare-<time>.{json,md}.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

VARIANTS = ("orbax-standard", "asyncckpt-jax", "asyncckpt-orbax-handler")
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "jax")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of float32 in the pytree")
    parser.add_argument("--arrays", type=int, default=8, help="arrays the bytes are split into")
    parser.add_argument("--repeats", type=int, default=3, help="saves per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--dir", default="/var/tmp/asyncckpt-jax-compare",
                        help="scratch directory for the checkpoints (emptied)")
    parser.add_argument("--out", default=RESULTS_DIR, help="where the JSON and markdown go")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def make_state(args):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    columns = 4096
    rows = max(8, int(args.gib * 2**30 / 4 / args.arrays / columns) // 8 * 8)
    rng = np.random.default_rng(0)
    state = {}
    for i in range(args.arrays):
        host = rng.standard_normal((rows, columns), dtype=np.float32)
        spec = P("data", "model") if i % 2 == 0 else P(None, "model")
        state[f"layer{i:02d}"] = jax.device_put(host, NamedSharding(mesh, spec))
        del host
    jax.block_until_ready(state)
    return state


def abstract(state):
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)


class OrbaxStandard:
    """Orbax's StandardCheckpointer with its defaults (asynchronous), one for every save."""

    def __init__(self, directory):
        import orbax.checkpoint as ocp

        self.directory = directory
        self.checkpointer = ocp.StandardCheckpointer()

    def save(self, state, repeat):
        path = os.path.join(self.directory, f"ckpt-{repeat}")
        start = time.perf_counter()
        self.checkpointer.save(path, state)
        blocked = time.perf_counter() - start
        self.checkpointer.wait_until_finished()
        return blocked, time.perf_counter() - start, path

    def restore(self, path, target):
        return self.checkpointer.restore(path, target)


class AsyncckptJax:
    """asyncckpt.jax.CheckpointManager, one for every save: step ``repeat + 1`` each time."""

    def __init__(self, directory):
        import asyncckpt.jax

        self.manager = asyncckpt.jax.CheckpointManager(directory, max_to_keep=1)

    def save(self, state, repeat):
        start = time.perf_counter()
        future = self.manager.save(repeat + 1, state)
        blocked = time.perf_counter() - start
        future.result()
        return blocked, time.perf_counter() - start, self.manager.checkpoint_path(repeat + 1)

    def restore(self, path, target):
        return self.manager.restore(target, step=int(path.rsplit("-", 1)[1]))


class AsyncckptOrbaxHandler(OrbaxStandard):
    """asyncckpt's handler under Orbax's AsyncCheckpointer, one for every save."""

    def __init__(self, directory):
        import orbax.checkpoint as ocp

        import asyncckpt.orbax

        self.directory = directory
        self.checkpointer = ocp.AsyncCheckpointer(asyncckpt.orbax.AsyncckptCheckpointHandler())
        self.save_args = asyncckpt.orbax.AsyncckptSave
        self.restore_args = asyncckpt.orbax.AsyncckptRestore

    def save(self, state, repeat):
        path = os.path.join(self.directory, f"ckpt-{repeat}")
        start = time.perf_counter()
        self.checkpointer.save(path, args=self.save_args(state))
        blocked = time.perf_counter() - start
        self.checkpointer.wait_until_finished()
        return blocked, time.perf_counter() - start, path

    def restore(self, path, target):
        return self.checkpointer.restore(path, args=self.restore_args(target))


RUNNERS = {"orbax-standard": OrbaxStandard, "asyncckpt-jax": AsyncckptJax,
           "asyncckpt-orbax-handler": AsyncckptOrbaxHandler}


def child(args):
    """One variant: prints its figures as one JSON line."""
    import jax
    import numpy as np

    state = make_state(args)
    rss_with_state = rss_bytes()
    figures = {"blocked": [], "durable": [], "restore": [], "bytes": []}
    directory = os.path.join(args.dir, args.child)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    runner = RUNNERS[args.child](directory)
    restored = None
    for repeat in range(args.repeats):
        blocked, durable, path = runner.save(state, repeat)
        figures["blocked"].append(blocked)
        figures["durable"].append(durable)
        figures["bytes"].append(du(path))
        start = time.perf_counter()
        restored = jax.block_until_ready(runner.restore(path, abstract(state)))
        figures["restore"].append(time.perf_counter() - start)
        if repeat + 1 < args.repeats:
            restored = None
            shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    exact = all(np.array_equal(np.asarray(state[k]), np.asarray(restored[k])) for k in state)
    print(json.dumps({
        "variant": args.child, "exact": exact,
        "state_bytes": sum(a.nbytes for a in state.values()),
        "rss_with_state": rss_with_state,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **{name: values for name, values in figures.items()}}))


def table(rows):
    orbax = next((r for r in rows if r["variant"] == "orbax-standard"), None)

    def ratio(row, key):
        if orbax is None or row is orbax:
            return ""
        return f" ({statistics.median(row[key]) / statistics.median(orbax[key]):.2f}x)"

    lines = [("| variant | blocked s (median) | durable s (median) | restore s (median) | "
              "bytes on disk | peak RSS GiB (pytree alone) | bit-exact |"),
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {statistics.median(r['blocked']):.3f}{ratio(r, 'blocked')} | "
            f"{statistics.median(r['durable']):.3f}{ratio(r, 'durable')} | "
            f"{statistics.median(r['restore']):.3f}{ratio(r, 'restore')} | "
            f"{statistics.median(r['bytes']) / 2**30:.3f} GiB | "
            f"{r['peak_rss'] / 2**30:.2f} ({r['rss_with_state'] / 2**30:.2f}) | {r['exact']} |")
    return "\n".join(lines)


def main(argv):
    args = parse_args(argv)
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8")
    if args.child:
        child(args)
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    load = os.getloadavg()[0]
    rows = []
    for variant in variants:
        command = [sys.executable, os.path.abspath(__file__), *argv, "--child", variant]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{variant}: done", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"jax_compare-{stamp}")
    markdown = table(rows)
    header = (f"`benchmarks/jax_compare.py {' '.join(argv)}` at {stamp} UTC; "
              f"1-minute load {load:.2f} at the start; ratios against orbax-standard")
    with open(base + ".json", "w") as out:
        json.dump({"command": argv, "load": load, "rows": rows}, out, indent=1)
    with open(base + ".md", "w") as out:
        out.write(header + "\n\n" + markdown + "\n")
    print(header + "\n\n" + markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
