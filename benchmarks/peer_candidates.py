#!/usr/bin/env python3
"""One checkpointer, one measurement, in its own process (so its peak RSS is its own): the
worker that benchmarks/peers_bench.py starts once per candidate, layout and size.

    PYTHONPATH=build/python .venv/bin/python benchmarks/peer_candidates.py \
        --candidate torch.save --layout transformer --bytes 64MiB --dir /work/bench-tmp/x \
        --save-every 10 --saves 3 --step-ms 100

It builds the state, runs a paced training loop (each step updates an eighth of the tensors in
place, then sleeps out --step-ms) for reference steps without saving, then --saves saves every
--save-every steps, waits until the last is durable, drops the newest checkpoint's files from the
page cache and restores it into fresh memory, reading one byte of every page of the result
inside the timing (a restore that maps the file lazily pays its reads there too). It prints one JSON object: the figures, the tool
each figure came from ("sources"), or {"status": "missing", "reason": ...} when a package the
candidate needs cannot be imported.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_proc

MiB = 1 << 20
REFERENCE_STEPS = 5
PERF_COUNTER = "perf_counter around the call"


# ---- the state ------------------------------------------------------------------------------
def transformer_layout(size: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of a transformer's training state of about `size` bytes: bfloat16
    weights (embedding, per-layer attention and MLP), float32 norms, and AdamW's two float32
    moments of every parameter."""
    d = 2048 if size >= 4 << 30 else 1024 if size >= 1 << 30 else 512 if size >= 256 * MiB else 256
    per_param = 2 + 4 + 4  # bf16 weight, exp_avg, exp_avg_sq
    vocab = max(d, min(32000, size // 4 // (per_param * d)))
    layer = {"attn.q": (d, d), "attn.k": (d, d), "attn.v": (d, d), "attn.o": (d, d),
             "mlp.up": (4 * d, d), "mlp.down": (d, 4 * d), "norm1": (d,), "norm2": (d,)}
    layer_params = sum(_numel(s) for s in layer.values())
    layers = max(1, (size - vocab * d * per_param) // (layer_params * per_param))
    params: list[tuple[str, tuple[int, ...], str]] = [("embed", (vocab, d), "bfloat16")]
    for i in range(layers):
        params += [(f"layers.{i}.{k}", s, "float32" if k.startswith("norm") else "bfloat16")
                   for k, s in layer.items()]
    params.append(("final_norm", (d,), "float32"))
    out = [(f"model.{n}", s, t) for n, s, t in params]
    for moment in ("exp_avg", "exp_avg_sq"):
        out += [(f"optim.{moment}.{n}", s, "float32") for n, s, _ in params]
    return out


def small_layout(size: int) -> list[tuple[str, tuple[int, ...], str]]:
    """10,000 float32 tensors of `size` bytes in all (run_bench's small layout)."""
    n = max(1, size // 4 // 10000)
    return [(f"t{i:05d}", (n,), "float32") for i in range(10000)]


LAYOUTS = {"transformer": transformer_layout, "small": small_layout}


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count


def state_bytes(layout: list[tuple[str, tuple[int, ...], str]]) -> int:
    return sum(_numel(s) * (2 if t == "bfloat16" else 4) for _, s, t in layout)


def torch_state(layout: list[tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    import torch
    generator = torch.Generator().manual_seed(0)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    return {n: torch.randn(s, generator=generator).to(dtypes[t]) for n, s, t in layout}


def empty_torch_state(layout: list[tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    import torch
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    return {n: torch.empty(s, dtype=dtypes[t]) for n, s, t in layout}


# ---- the candidates ---------------------------------------------------------------------------
class Candidate:
    """A checkpointer: `save` returns when the loop may go on; `durable` lists each save's
    seconds until it was durable; `restore` reads the newest checkpoint into fresh memory."""

    modules: tuple[str, ...] = ()
    framework = "torch"
    blocked_source = PERF_COUNTER
    durable_source = PERF_COUNTER + " (a synchronous save: durable when it returns)"
    restore_source = PERF_COUNTER

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        self.directory = directory
        self.layout = layout
        self.state = state
        self.latest: str | None = None
        self._durable: list[float] = []
        self._blocked: list[float] = []

    def save(self, step: int) -> None:
        start = time.perf_counter()
        self.latest = self.write(step)
        self._durable.append(time.perf_counter() - start)

    def write(self, step: int) -> str:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def durable(self) -> list[float]:
        return self._durable

    def blocked(self, measured: list[float]) -> list[float]:
        return measured

    def restore(self) -> Any:
        raise NotImplementedError


def _durable_file(path: str, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


class TorchSave(Candidate):
    modules = ("torch",)

    def write(self, step: int) -> str:
        import torch
        path = os.path.join(self.directory, f"ckpt-{step}.pt")
        _durable_file(path, lambda f: torch.save(self.state, f))
        bench_proc.fsync_path(self.directory)
        return path

    def restore(self) -> Any:
        import torch
        return torch.load(self.latest, weights_only=True)


class SafetensorsSave(Candidate):
    modules = ("torch", "safetensors")

    def write(self, step: int) -> str:
        from safetensors.torch import save_file
        path = os.path.join(self.directory, f"ckpt-{step}.safetensors")
        save_file(self.state, path)
        bench_proc.fsync_path(path)
        bench_proc.fsync_path(self.directory)
        return path

    def restore(self) -> Any:
        from safetensors.torch import load_file
        return load_file(self.latest)


class NumpySave(Candidate):
    """numpy.save of each tensor to its own file, each fsynced (bfloat16 as ml_dtypes')."""

    modules = ("numpy", "ml_dtypes")

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        import ml_dtypes
        import torch
        super().__init__(directory, layout, state)
        self.arrays = {n: (t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
                           if t.dtype == torch.bfloat16 else t.numpy()) for n, t in state.items()}

    def write(self, step: int) -> str:
        import numpy as np
        path = os.path.join(self.directory, f"ckpt-{step}")
        os.makedirs(path)
        for name, array in self.arrays.items():
            _durable_file(os.path.join(path, name + ".npy"), lambda f, a=array: np.save(f, a))
        bench_proc.fsync_path(path)
        bench_proc.fsync_path(self.directory)
        return path

    def restore(self) -> Any:
        import numpy as np
        assert self.latest is not None
        return {n[:-4]: np.load(os.path.join(self.latest, n)) for n in os.listdir(self.latest)}


def _one_rank_group() -> None:
    """DCP on one rank: a gloo group of one process, as a single-GPU job would run it."""
    import torch.distributed as dist
    if not dist.is_initialized():
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


class _AsyncDurable:
    """Records each asynchronous save's time to durable from its future's completion."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.pending: list[Any] = []

    def watch(self, future: Any, start: float) -> None:
        future.add_done_callback(lambda _: self.times.append(time.perf_counter() - start))
        self.pending.append(future)

    def wait(self) -> None:
        for future in self.pending:
            future.result()
        self.pending = []


class DcpSave(Candidate):
    modules = ("torch", "torch.distributed.checkpoint")

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        super().__init__(directory, layout, state)
        _one_rank_group()

    def write(self, step: int) -> str:
        import torch.distributed.checkpoint as dcp
        path = os.path.join(self.directory, f"ckpt-{step}")
        dcp.save(self.state, checkpoint_id=path)
        return path

    def restore(self) -> Any:
        import torch.distributed.checkpoint as dcp
        fresh = empty_torch_state(self.layout)
        dcp.load(fresh, checkpoint_id=self.latest)
        return fresh


class DcpAsyncSave(DcpSave):
    durable_source = "perf_counter until the async_save future's done callback"

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        super().__init__(directory, layout, state)
        self.futures = _AsyncDurable()

    def save(self, step: int) -> None:
        start = time.perf_counter()
        self.futures.wait()  # DCP's own rule: one async_save in flight
        self.latest = os.path.join(self.directory, f"ckpt-{step}")
        self.futures.watch(self.submit(self.latest), start)

    def submit(self, path: str) -> Any:
        import torch.distributed.checkpoint as dcp
        result = dcp.async_save(self.state, checkpoint_id=path)
        return getattr(result, "upload_completion", result)

    def finish(self) -> None:
        self.futures.wait()

    def durable(self) -> list[float]:
        return self.futures.times


class AsyncckptDcp(DcpAsyncSave):
    """asyncckpt.torch.StorageWriter + Stager under dcp.async_save, one rank."""

    modules = ("torch", "torch.distributed.checkpoint", "asyncckpt.torch")

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        import asyncckpt.torch
        super().__init__(directory, layout, state)
        self.stager = asyncckpt.torch.Stager()

    def submit(self, path: str) -> Any:
        import torch.distributed.checkpoint as dcp

        import asyncckpt.torch
        result = dcp.async_save(self.state, storage_writer=asyncckpt.torch.StorageWriter(path),
                                async_stager=self.stager)
        return getattr(result, "upload_completion", result)

    def finish(self) -> None:
        super().finish()
        self.stager.close()

    def restore(self) -> Any:
        import torch.distributed.checkpoint as dcp

        import asyncckpt.torch
        fresh = empty_torch_state(self.layout)
        dcp.load(fresh, storage_reader=asyncckpt.torch.StorageReader(self.latest))
        return fresh


def _specs(state: dict[str, Any]) -> list[tuple]:
    import torch
    short = {torch.float32: "f32", torch.bfloat16: "bf16"}
    return [(n, short[t.dtype], list(t.shape), t.data_ptr(), t.numel() * t.element_size(), None)
            for n, t in state.items()]


def _wait_for_latest(saver: Any) -> str:
    """The newest checkpoint's path once every save of `saver` (a Checkpointer or a manager)
    has finished."""
    saver.wait_until_finished()
    return str(saver.checkpoint_path(saver.latest_step()))


class CppCheckpointer(Candidate):
    """The C++ Checkpointer through asyncckpt._core with its default SaverOptions: the
    tensors' addresses handed to it once per save, nothing else in Python."""

    modules = ("asyncckpt._core",)
    asynchronous = True
    blocked_source = "Checkpointer.totals() blocked_seconds (C++)"
    durable_source = "Checkpointer.totals() seconds_to_durable (C++)"

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        from asyncckpt import _core
        super().__init__(directory, layout, state)
        options = _core.SaverOptions()
        options.save_steps = 1
        self.core = _core.Checkpointer(directory, options, self.asynchronous)
        self.specs = _specs(state)

    def save(self, step: int) -> None:
        self.core.save(step, self.specs, {})

    def finish(self) -> None:
        self.latest = _wait_for_latest(self.core)
        self.totals = self.core.totals()
        self.core.close()

    def durable(self) -> list[float]:
        return [s["seconds_to_durable"] for s in self.totals["saves"]]

    def blocked(self, measured: list[float]) -> list[float]:
        return [s["blocked_seconds"] for s in self.totals["saves"]]

    def restore(self) -> Any:
        from asyncckpt import _core
        fresh = empty_torch_state(self.layout)
        _core.open_reader(self.latest).read_into(_specs(fresh))
        return fresh


class CppCheckpointerSync(CppCheckpointer):
    asynchronous = False


class Manager(Candidate):
    """asyncckpt.CheckpointManager with its defaults (asynchronous)."""

    modules = ("asyncckpt",)
    manager_module = "asyncckpt"
    blocked_source = PERF_COUNTER
    durable_source = ("CheckpointManager.stats() seconds_to_durable plus the Python time before "
                      "the engine's save began (perf_counter around the call less the stats' "
                      "blocked_seconds)")

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        super().__init__(directory, layout, state)
        self.manager = importlib.import_module(self.manager_module).CheckpointManager(directory)

    def save(self, step: int) -> None:
        self.manager.save(step, self.state)

    def finish(self) -> None:
        self.latest = _wait_for_latest(self.manager)
        self.stats = self.manager.stats()
        self.manager.close()

    def blocked(self, measured: list[float]) -> list[float]:
        self.measured = measured
        return measured

    def durable(self) -> list[float]:
        # The engine's clock starts when the flattened state reaches it; the loop's when it
        # calls save.
        return [s.seconds_to_durable + max(0.0, m - s.blocked_seconds)
                for s, m in zip(self.stats.saves, self.measured)]

    def restore(self) -> Any:
        import asyncckpt
        fresh = empty_torch_state(self.layout)
        with asyncckpt.CheckpointManager(self.directory) as manager:
            manager.restore(fresh)
        return fresh


def jax_state(layout: list[tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    out = {}
    for i, (n, s, t) in enumerate(layout):
        out[n] = jax.random.normal(jax.random.fold_in(key, i), s, dtype=jnp.float32).astype(t)
    return out


def abstract_jax_state(layout: list[tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    return {n: jax.ShapeDtypeStruct(s, jnp.dtype(t)) for n, s, t in layout}


class JaxManager(Manager):
    """asyncckpt.jax.CheckpointManager with its defaults (the JAX manager)."""

    modules = ("jax", "asyncckpt.jax")
    manager_module = "asyncckpt.jax"
    framework = "jax"

    def restore(self) -> Any:
        import asyncckpt.jax
        with asyncckpt.jax.CheckpointManager(self.directory) as manager:
            return manager.restore(abstract_jax_state(self.layout))


class Orbax(Candidate):
    """orbax.checkpoint.StandardCheckpointer with its defaults (asynchronous)."""

    modules = ("jax", "orbax.checkpoint")
    framework = "jax"
    durable_source = "perf_counter until wait_until_finished returns, on a watching thread"

    def __init__(self, directory: str, layout: list, state: dict[str, Any]) -> None:
        import orbax.checkpoint as ocp
        super().__init__(directory, layout, state)
        self.checkpointer = ocp.StandardCheckpointer()
        self.watcher: threading.Thread | None = None

    def save(self, step: int) -> None:
        start = time.perf_counter()
        self.latest = os.path.join(self.directory, f"ckpt-{step}")
        self.checkpointer.save(self.latest, self.state)

        def watch() -> None:
            self.checkpointer.wait_until_finished()
            self._durable.append(time.perf_counter() - start)

        self.finish()
        self.watcher = threading.Thread(target=watch)
        self.watcher.start()

    def finish(self) -> None:
        if self.watcher is not None:
            self.watcher.join()
            self.watcher = None

    def restore(self) -> Any:
        return self.checkpointer.restore(self.latest, abstract_jax_state(self.layout))


CANDIDATES: dict[str, type[Candidate]] = {
    "asyncckpt-cpp-async": CppCheckpointer,
    "asyncckpt-cpp-sync": CppCheckpointerSync,
    "asyncckpt-manager": Manager,
    "asyncckpt-dcp": AsyncckptDcp,
    "asyncckpt-jax": JaxManager,
    "torch.save": TorchSave,
    "dcp.save": DcpSave,
    "dcp.async_save": DcpAsyncSave,
    "safetensors": SafetensorsSave,
    "numpy.save": NumpySave,
    "orbax": Orbax,
}


def missing_module(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported, or None."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def missing_reason(candidate: str) -> str | None:
    """'missing: <module> not importable' when a package `candidate` needs is absent."""
    name = missing_module(CANDIDATES[candidate].modules)
    return None if name is None else f"missing: {name} not importable"


# ---- the loop ---------------------------------------------------------------------------------
class PacedUpdate:
    """One training step: an eighth of the tensors changed in place (replaced, for JAX's
    immutable arrays), then a sleep until `step_ms` has passed."""

    def __init__(self, state: dict[str, Any], framework: str, step_ms: float) -> None:
        self.state, self.framework, self.step_s = state, framework, step_ms / 1000
        self.names = list(state)
        self.count = 0

    def step(self) -> float:
        start = time.perf_counter()
        part = self.names[self.count % 8::8]
        self.count += 1
        for name in part:
            if self.framework == "jax":
                self.state[name] = self.state[name] + 1
            else:
                self.state[name].add_(1)
        if self.framework == "jax":
            for name in part:
                self.state[name].block_until_ready()
        left = self.step_s - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    reason = missing_reason(args.candidate)
    if reason:
        return {"status": "missing", "reason": reason}
    cls = CANDIDATES[args.candidate]
    layout = LAYOUTS[args.layout](args.bytes)
    total = state_bytes(layout)
    state = jax_state(layout) if cls.framework == "jax" else torch_state(layout)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    loop = PacedUpdate(state, cls.framework, args.step_ms)
    reference = statistics.median(loop.step() for _ in range(REFERENCE_STEPS))
    gc.collect()
    rss_before = bench_proc.status_kib("VmRSS") * 1024
    rss_reset = bench_proc.reset_peak_rss()
    candidate = cls(args.dir, layout, state)
    blocked = []
    loop_start = time.perf_counter()
    steps = args.saves * args.save_every
    for i in range(1, steps + 1):
        loop.step()
        if i % args.save_every == 0:
            start = time.perf_counter()
            candidate.save(i)
            blocked.append(time.perf_counter() - start)
    loop_seconds = time.perf_counter() - loop_start
    candidate.finish()
    peak = bench_proc.status_kib("VmHWM") * 1024 if rss_reset else None
    blocked = candidate.blocked(blocked)
    durable = candidate.durable()
    assert candidate.latest is not None
    on_disk = bench_proc.bytes_on_disk(candidate.latest)
    # The restore gets the memory the saves held back.
    del loop, state
    candidate.state = {}
    gc.collect()
    bench_proc.drop_page_cache(candidate.latest)
    start = time.perf_counter()
    restored = candidate.restore()
    touch_every_page(restored)
    restore_seconds = time.perf_counter() - start
    del restored
    shutil.rmtree(args.dir, ignore_errors=True)
    return {
        "status": "ok", "state_bytes": total, "tensors": len(layout),
        "blocked_s": statistics.median(blocked), "blocked_all_s": blocked,
        "durable_s": statistics.median(durable) if durable else None, "durable_all_s": durable,
        "reference_step_s": reference, "loop_seconds": loop_seconds, "steps": steps,
        "loop_lost_s": (loop_seconds - steps * reference) / args.saves,
        "restore_s": restore_seconds, "bytes_on_disk": on_disk,
        "peak_rss_bytes": peak, "rss_before_bytes": rss_before,
        "sources": {"blocked": cls.blocked_source, "durable": cls.durable_source,
                    "restore": cls.restore_source + " (page cache dropped: posix_fadvise; "
                               "every page of the result read once inside the timing)",
                    "loop_lost": "paced loop: wall time beyond steps x reference step",
                    "peak_rss": "VmHWM after /proc/self/clear_refs",
                    "bytes_on_disk": "st_blocks of the newest checkpoint"},
    }


PAGE_BYTES = 4096


def touch_every_page(restored: Any) -> int:
    """Reads one byte of every 4 KiB page of every tensor or array in `restored` (dicts, lists and
    tuples are walked). A restore that maps its file and reads it only when a page is first
    touched (safetensors' load_file returns tensors over a private mmap of the file) would
    otherwise be timed without its reads, against restores that read everything eagerly. For
    those the pass costs a strided read of memory already there, the same for every candidate."""
    import numpy as np

    if isinstance(restored, dict):
        return sum(touch_every_page(value) for value in restored.values())
    if isinstance(restored, (list, tuple)):
        return sum(touch_every_page(value) for value in restored)
    if type(restored).__module__.startswith("torch"):
        import torch
        if isinstance(restored, torch.Tensor) and restored.numel() > 0:
            flat = restored.detach().contiguous().reshape(-1).view(torch.uint8)
            return int(flat[::PAGE_BYTES].sum())
        return 0
    shards = getattr(restored, "addressable_shards", None)
    if shards is not None and len(shards) > 1:  # a sharded JAX array: each shard's own memory
        return sum(touch_every_page(shard.data) for shard in shards)
    if hasattr(restored, "__array__") and hasattr(restored, "dtype"):
        array = np.asarray(restored)  # a one-device JAX array on the CPU: its memory, once ready
        if array.size == 0:
            return 0
        return int(np.ascontiguousarray(array).reshape(-1).view(np.uint8)[::PAGE_BYTES].sum())
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidate", required=True, choices=list(CANDIDATES))
    p.add_argument("--layout", required=True, choices=list(LAYOUTS))
    p.add_argument("--bytes", required=True, type=int)
    p.add_argument("--dir", required=True)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=100)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    result = measure(parse_args(argv))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
