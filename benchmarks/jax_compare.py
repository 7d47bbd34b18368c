#!/usr/bin/env python3
"""Orbax's StandardCheckpointer against asyncckpt's JAX manager and asyncckpt through the Orbax
handler, side by side in one run, on the same sharded pytree (1 GiB of float32 by default, on a
Mesh of 8 CPU devices, or of the GPUs with --platform gpu).

    PYTHONPATH=build/python .venv/bin/python benchmarks/jax_compare.py
    PYTHONPATH=build/python python3 benchmarks/jax_compare.py --platform gpu --gib 2

--platform cpu (the default) forces 8 host devices through XLA_FLAGS and shards over a (4, 2)
mesh of them. --platform gpu leaves XLA_FLAGS alone and takes jax.devices("gpu"), up to 8: a
(n // 2, 2) mesh of n devices when n is even, else (n, 1). A probe child first names the
platform's devices (the parent never starts a JAX backend, so no GPU memory is held while the
variants run), and the run stops there, with a message naming the platform, when JAX has none.

Each variant runs in a child process of its own (so its peak RSS is its own), which makes the
same seeded pytree, then saves it --repeats times with one checkpointer (the first save pays
for its set-up, the median does not) and restores each save onto a target of ShapeDtypeStructs with the same shardings. Figures per variant (medians
over the repeats): seconds blocked in save (the call's return), seconds to durable (from the
call until the variant says the checkpoint is complete: Orbax's wait_until_finished, the save
future's result, the handler's commit), restore seconds (until every array is ready), bytes on
disk, and the child's peak RSS beside its RSS with the pytree alone. Restores are cold by
default (--restore cold): each checkpoint's files are fsynced and dropped from the page cache
first, outside the timings. Without it Orbax's restore read its files from the page cache, where
its buffered writes had left them, while asyncckpt's O_DIRECT writes leave nothing there, so the
two restores did not read the same medium (--restore warm keeps that). A child that exits with an error or runs past --timeout seconds is a row with its error;
the run goes on with the next variant, and exits 1 after writing the results. Writes
benchmarks/results/jax/jax_compare-<time>.{json,md}, the platform, the device kind and the mesh
in both.
"""

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_proc  # beside this script, here and in scripts/gpu-check's pack

VARIANTS = ("orbax-standard", "asyncckpt-jax", "asyncckpt-orbax-handler")
PLATFORMS = ("cpu", "gpu")
MAX_DEVICES = 8
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
    parser.add_argument("--platform", choices=PLATFORMS, default="cpu",
                        help="cpu: 8 forced host devices; gpu: the GPUs JAX sees, up to 8")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds each child (the probe, each variant) may run")
    parser.add_argument("--restore", choices=("cold", "warm"), default="cold",
                        help="cold (the default): every file of the checkpoint is fsynced and "
                             "dropped from the page cache before the restore, so every variant "
                             "reads the disk; warm: restore whatever the save left cached")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
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


def mesh_shape(count):
    """(data, model) extents for `count` devices: (count // 2, 2) when even, else (count, 1)."""
    return (count // 2, 2) if count >= 2 and count % 2 == 0 else (count, 1)


def make_mesh(platform):
    """The Mesh of --platform's devices, or an exit naming the platform when JAX has none."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    try:
        devices = jax.devices(platform)[:MAX_DEVICES]
    except RuntimeError as error:  # the backend is unknown or failed to start
        sys.exit(f"jax_compare: JAX has no {platform} devices here ({error})")
    if not devices:
        sys.exit(f"jax_compare: JAX has no {platform} devices here")
    shape = mesh_shape(len(devices))
    return Mesh(np.array(devices).reshape(shape), ("data", "model"))


def probe(args):
    """The platform's devices and mesh, as one JSON line."""
    mesh = make_mesh(args.platform)
    devices = mesh.devices.flatten()
    print(json.dumps({"platform": args.platform, "device_kind": devices[0].device_kind,
                      "devices": len(devices), "mesh": list(mesh.devices.shape)}))


def make_state(args):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = make_mesh(args.platform)
    columns = 4096
    # Rows divide by 8 and by the "data" extent (3, 5 or 7 on an odd number of GPUs).
    multiple = math.lcm(8, mesh.devices.shape[0])
    rows = max(multiple, int(args.gib * 2**30 / 4 / args.arrays / columns) // multiple * multiple)
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


def drop_page_cache(path):
    """fsync, then drop from the page cache, every file under `path`: a restore then reads the
    disk, whether the save wrote through the page cache (Orbax) or around it (O_DIRECT). The
    kernel keeps dirty pages, so the fsync comes first."""
    for root, _, files in os.walk(path):
        for name in files:
            bench_proc.fsync_path(os.path.join(root, name))
    bench_proc.drop_page_cache(path)


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
        if args.restore == "cold":
            drop_page_cache(path)
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
    orbax = next((r for r in rows if r["variant"] == "orbax-standard" and "error" not in r), None)

    def ratio(row, key):
        if orbax is None or row is orbax:
            return ""
        return f" ({statistics.median(row[key]) / statistics.median(orbax[key]):.2f}x)"

    lines = [("| variant | blocked s (median) | durable s (median) | restore s (median) | "
              "bytes on disk | peak RSS GiB (pytree alone) | bit-exact |"),
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'].replace('|', '/')} | | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {statistics.median(r['blocked']):.3f}{ratio(r, 'blocked')} | "
            f"{statistics.median(r['durable']):.3f}{ratio(r, 'durable')} | "
            f"{statistics.median(r['restore']):.3f}{ratio(r, 'restore')} | "
            f"{statistics.median(r['bytes']) / 2**30:.3f} GiB | "
            f"{r['peak_rss'] / 2**30:.2f} ({r['rss_with_state'] / 2**30:.2f}) | {r['exact']} |")
    return "\n".join(lines)


def run_child(argv, args, flag):
    """Runs this script with `flag` added; its last stdout line as JSON, or {"error": why}."""
    command = [sys.executable, os.path.abspath(__file__), *argv, *flag]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past the {args.timeout:.0f} s limit (--timeout)"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {why[-300:]}"}
    return json.loads(lines[-1])


def main(argv):
    args = parse_args(argv)
    if args.platform == "cpu" and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={MAX_DEVICES}")
    if args.probe:
        probe(args)
        return
    if args.child:
        child(args)
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    load = os.getloadavg()[0]
    devices = run_child(argv, args, ["--probe"])
    if "error" in devices:
        sys.exit(f"jax_compare: --platform {args.platform}: {devices['error']}")
    rows = []
    for variant in variants:
        row = run_child(argv, args, ["--child", variant])
        if "error" in row:
            row = {"variant": variant, **row}
            shutil.rmtree(os.path.join(args.dir, variant), ignore_errors=True)
        rows.append(row)
        print(f"{variant}: {'failed: ' + row['error'] if 'error' in row else 'done'}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"jax_compare-{stamp}")
    markdown = table(rows)
    mesh = "x".join(str(extent) for extent in devices["mesh"])
    header = (f"`benchmarks/jax_compare.py {' '.join(argv)}` at {stamp} UTC; platform "
              f"{args.platform}, {devices['devices']} x {devices['device_kind']} (mesh {mesh}); "
              f"{args.restore} restores; 1-minute load {load:.2f} at the start; ratios against "
              f"orbax-standard")
    with open(base + ".json", "w") as out:
        json.dump({"command": argv, "load": load, "restore": args.restore, **devices,
                   "rows": rows}, out, indent=1)
    with open(base + ".md", "w") as out:
        out.write(header + "\n\n" + markdown + "\n")
    print(header + "\n\n" + markdown)
    failed = [row["variant"] for row in rows if "error" in row]
    if failed:
        sys.exit(f"jax_compare: {', '.join(failed)} failed (the table says why)")


if __name__ == "__main__":
    main(sys.argv[1:])
