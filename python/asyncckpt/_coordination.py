"""The processes of a job, as the C++ Checkpointer agrees with them: a _core.Coordinator whose
two collectives run on the framework's own machinery, never a protocol of asyncckpt's.

- ``torch_coordinator(group)``: a torch.distributed process group (gloo or NCCL), through
  ``broadcast_object_list`` and ``all_gather_object``;
- ``jax_coordinator()``: the processes of ``jax.distributed.initialize``, through its key-value
  store.

The Checkpointer calls them on the thread that saves, at the points every rank reaches in the
same order (each save, wait_until_finished, close); a save's commit agrees through the file
system, so a rank that dies cannot hang the others in a collective of ours beyond the
framework's own timeout.
"""

from __future__ import annotations

import itertools
from typing import Any

from . import _core


def torch_coordinator(group: Any = None) -> _core.Coordinator:
    """The ranks of torch.distributed process ``group`` (None: the default group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("a process group needs torch.distributed.init_process_group() first")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)

    def global_rank(group_rank: int) -> int:
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    def broadcast(data: bytes, root: int) -> bytes:
        objects: list[Any] = [data if rank == root else None]
        dist.broadcast_object_list(objects, src=global_rank(root), group=group)
        return bytes(objects[0])

    def all_gather(data: bytes) -> list[bytes]:
        gathered: list[Any] = [None] * size
        dist.all_gather_object(gathered, data, group=group)
        return [bytes(item) for item in gathered]

    return _core.Coordinator(rank, size, broadcast, all_gather)


def default_coordinator(group: Any = None) -> _core.Coordinator | None:
    """The coordinator of torch.distributed ``group``; with None, of the default group when
    torch.distributed is initialized with several ranks; else None (one process)."""
    if group is not None:
        return torch_coordinator(group)
    import sys

    if "torch.distributed" not in sys.modules:  # never imports torch for a NumPy job
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return torch_coordinator(None)
    return None


def jax_coordinator(timeout_seconds: float = 300.0) -> _core.Coordinator:
    """The processes of ``jax.distributed.initialize``, through its key-value store: each
    collective writes this process's bytes under a key of its own and reads the others'."""
    import jax
    from jax._src import distributed

    rank, size = jax.process_index(), jax.process_count()
    client: Any = distributed.global_state.client
    if client is None:
        raise RuntimeError("a JAX coordinator needs jax.distributed.initialize() first")
    rounds = itertools.count()
    timeout_ms = int(timeout_seconds * 1000)

    def exchange(data: bytes, readers: list[int]) -> list[bytes]:
        n = next(rounds)
        client.key_value_set_bytes(f"asyncckpt/{n}/{rank}", data)
        out = [client.blocking_key_value_get_bytes(f"asyncckpt/{n}/{r}", timeout_ms)
               for r in readers]
        # Every process has read round n before any removes its key.
        client.wait_at_barrier(f"asyncckpt/{n}/read", timeout_ms)
        client.key_value_delete(f"asyncckpt/{n}/{rank}")
        return out

    def broadcast(data: bytes, root: int) -> bytes:
        return exchange(data, [root])[0]

    def all_gather(data: bytes) -> list[bytes]:
        return exchange(data, list(range(size)))

    return _core.Coordinator(rank, size, broadcast, all_gather)
