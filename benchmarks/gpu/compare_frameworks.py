"""What GPU users' checkpointers cost on the same state and disk, for scripts/gpu-check.

Each part runs in its own process (JAX and PyTorch do not share a GPU well) under a time limit,
on ``--gib`` GiB of fp32 state in ``--tensors`` GPU tensors, and prints one JSON object:

    torch_save    torch.save + fsync (blocked = to durable); torch.load back onto the GPU
    dcp           torch.distributed.checkpoint.async_save, default stager; dcp.load
    dcp_pinned    async_save with DefaultStager(StagingOptions(use_pinned_memory=True, ...))
    orbax         orbax.checkpoint async save of JAX arrays; restore onto the GPU
    asyncckpt     asyncckpt.CheckpointManager, asynchronous (blocked = until the state may
                  change again; durable = wait_until_finished); restore into GPU tensors
    asyncckpt_stream_ordered   the same with cuda_stream_ordered=True: save returns once the
                  copies are enqueued on the GPU

Per part: the blocked time of the first save and the median of the later ones, the time to
durable, and the restore's seconds and GB/s (the files dropped from the page cache first). A
part whose framework is missing reports ``"error"`` instead.

    python3 benchmarks/gpu/compare_frameworks.py --dir DIR [--gib 8] [--tensors 16]
        [--saves 3] [--parts torch_save,dcp,dcp_pinned,orbax] [--timeout 150] [--json FILE]
        [--device cpu]   (torch parts on the CPU: checks the script on a machine without a GPU)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def drop_cache(path):
    """fdatasync and POSIX_FADV_DONTNEED every file under path, so a read comes from the disk."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def sync_tree(path):
    """fsync every file and directory under path (what a durable save needs)."""
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def summary(blocked, durable, restore_seconds, state_bytes):
    """The part's JSON fields."""
    out = {"blocked_first_seconds": blocked[0],
           "blocked_steady_median_seconds": statistics.median(blocked[1:]),
           "to_durable_median_seconds": statistics.median(durable)}
    if restore_seconds:
        out["restore_seconds"] = restore_seconds
        out["restore_gbps"] = state_bytes / restore_seconds / 1e9
    return out


def torch_state(args):
    import torch
    per = int(args.gib * (1 << 30)) // 4 // args.tensors
    torch.manual_seed(0)
    return {f"layer{100 + t}/w": torch.rand(per, device=args.device) for t in range(args.tensors)}


def synchronize(args):
    import torch
    if args.device == "cuda":
        torch.cuda.synchronize()


def part_torch_save(args, where):
    import torch
    state = torch_state(args)
    size = sum(t.numel() * 4 for t in state.values())
    blocked, durable = [], []
    path = os.path.join(where, "state.pt")
    for _ in range(args.saves):
        synchronize(args)
        start = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - start
        blocked.append(seconds)
        durable.append(seconds)
    drop_cache(where)
    start = time.perf_counter()
    back = torch.load(path, map_location=args.device)
    synchronize(args)
    restore = time.perf_counter() - start
    assert all(torch.equal(back[k], state[k]) for k in state), "torch.load is not bit-exact"
    return summary(blocked, durable, restore, size)


def dcp_setup(where):
    """A process group of one (async_save needs one); a file store, so no port is taken."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{where}/process-group", rank=0,
                                world_size=1)


def part_dcp(args, where, pinned):
    import torch
    import torch.distributed.checkpoint as dcp
    dcp_setup(where)
    state = torch_state(args)
    size = sum(t.numel() * 4 for t in state.values())
    kwargs = {}
    if pinned:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        kwargs["async_stager"] = DefaultStager(StagingOptions(
            use_pinned_memory=True, use_shared_memory=False, use_async_staging=True,
            use_non_blocking_copy=True))
    blocked, durable = [], []
    for i in range(args.saves):
        path = os.path.join(where, f"step{i}")
        synchronize(args)
        start = time.perf_counter()
        result = dcp.async_save(state, checkpoint_id=path, **kwargs)
        blocked.append(time.perf_counter() - start)
        future = getattr(result, "upload_completion", result)
        staging = getattr(result, "staging_completion", None)
        if staging is not None:
            staging.result()
        future.result()
        sync_tree(path)
        durable.append(time.perf_counter() - start)
        if i + 1 < args.saves:
            shutil.rmtree(path)
    drop_cache(where)
    back = {k: torch.empty_like(v) for k, v in state.items()}
    start = time.perf_counter()
    dcp.load(back, checkpoint_id=os.path.join(where, f"step{args.saves - 1}"))
    synchronize(args)
    restore = time.perf_counter() - start
    assert all(torch.equal(back[k], state[k]) for k in state), "dcp.load is not bit-exact"
    return summary(blocked, durable, restore, size)


def part_orbax(args, where):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    per = int(args.gib * (1 << 30)) // 4 // args.tensors
    keys = jax.random.split(jax.random.PRNGKey(0), args.tensors)
    state = {f"layer{100 + t}": jax.random.uniform(keys[t], (per,), dtype=jnp.float32)
             for t in range(args.tensors)}
    jax.block_until_ready(state)
    size = per * 4 * args.tensors
    checkpointer = ocp.StandardCheckpointer()
    blocked, durable = [], []
    for i in range(args.saves):
        path = os.path.join(where, f"step{i}")
        start = time.perf_counter()
        checkpointer.save(path, state)
        blocked.append(time.perf_counter() - start)
        checkpointer.wait_until_finished()
        sync_tree(path)
        durable.append(time.perf_counter() - start)
        if i + 1 < args.saves:
            shutil.rmtree(path)
    drop_cache(where)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
    start = time.perf_counter()
    back = checkpointer.restore(os.path.join(where, f"step{args.saves - 1}"), abstract)
    jax.block_until_ready(back)
    restore = time.perf_counter() - start
    assert all(np.array_equal(np.asarray(back[k]), np.asarray(state[k])) for k in state)
    return summary(blocked, durable, restore, size)


def part_asyncckpt(args, where, stream_ordered):
    import torch

    import asyncckpt
    state = torch_state(args)
    size = sum(t.numel() * 4 for t in state.values())
    blocked, durable = [], []
    with asyncckpt.CheckpointManager(where, max_to_keep=1,
                                     cuda_stream_ordered=stream_ordered) as manager:
        for step in range(1, args.saves + 1):
            synchronize(args)
            start = time.perf_counter()
            manager.save(step, state)
            blocked.append(time.perf_counter() - start)
            manager.wait_until_finished()
            durable.append(time.perf_counter() - start)
    drop_cache(where)
    back = {k: torch.empty_like(v) for k, v in state.items()}
    with asyncckpt.CheckpointManager(where) as manager:
        start = time.perf_counter()
        restored = manager.restore(back)
        synchronize(args)
        restore = time.perf_counter() - start
    assert restored == args.saves, restored
    assert all(torch.equal(back[k], state[k]) for k in state), "asyncckpt is not bit-exact"
    return summary(blocked, durable, restore, size)


PARTS = {
    "torch_save": part_torch_save,
    "dcp": lambda args, where: part_dcp(args, where, pinned=False),
    "dcp_pinned": lambda args, where: part_dcp(args, where, pinned=True),
    "orbax": part_orbax,
    "asyncckpt": lambda args, where: part_asyncckpt(args, where, stream_ordered=False),
    "asyncckpt_stream_ordered": lambda args, where: part_asyncckpt(args, where,
                                                                   stream_ordered=True),
}


def run_one(args):
    """In the child process: one part, its JSON on stdout's last line."""
    where = os.path.join(os.path.abspath(args.dir), args.part)  # Orbax wants absolute paths
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    try:
        result = PARTS[args.part](args, where)
    except Exception as error:  # noqa: BLE001 - a missing framework is a result, not a crash
        result = {"error": f"{type(error).__name__}: {error}"}
    finally:
        shutil.rmtree(where, ignore_errors=True)
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--gib", type=float, default=8)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--timeout", type=float, default=150, help="seconds per part")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cuda", help="torch parts only; cpu checks the script")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        run_one(args)
        return
    results = {}
    for part in args.parts.split(","):
        command = [sys.executable, __file__, "--part", part, "--dir", args.dir, "--gib",
                   str(args.gib), "--tensors", str(args.tensors), "--saves", str(args.saves),
                   "--device", args.device]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                                  check=False)
            lines = done.stdout.strip().splitlines()
            results[part] = json.loads(lines[-1]) if lines else {
                "error": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}
        except subprocess.TimeoutExpired:
            results[part] = {"error": f"over the {args.timeout:.0f} s limit"}
        shutil.rmtree(os.path.join(args.dir, part), ignore_errors=True)
        print(part, json.dumps(results[part]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
