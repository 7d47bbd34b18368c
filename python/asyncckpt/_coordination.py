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
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import _core

T = TypeVar("T")


def torch_coordinator(group: Any = None) -> _core.Coordinator:
    """The ranks of torch.distributed process ``group`` (None: the default group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("a process group needs torch.distributed.init_process_group() first")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)

    def global_rank(group_rank: int) -> int:
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    _start_heartbeat(dist, global_rank(rank))

    def naming_the_silent(collective: Callable[[], T]) -> T:
        try:
            return collective()
        except Exception as error:
            silent = _silent_ranks(dist, size, global_rank)
            raise RuntimeError(_collective_failure(silent, error)) from error

    def broadcast(data: bytes, root: int) -> bytes:
        objects: list[Any] = [data if rank == root else None]
        naming_the_silent(lambda: dist.broadcast_object_list(objects, src=global_rank(root),
                                                             group=group))
        return bytes(objects[0])

    def all_gather(data: bytes) -> list[bytes]:
        gathered: list[Any] = [None] * size
        naming_the_silent(lambda: dist.all_gather_object(gathered, data, group=group))
        return [bytes(item) for item in gathered]

    return _core.Coordinator(rank, size, broadcast, all_gather)


# Every rank of a torch job beats on the job's store (torch.distributed's key-value store, which
# outlives a worker under torchrun) from a thread of its own, also while its training thread is
# blocked in a collective. After a failed collective, a rank whose count stands still for
# ROLL_CALL_SECONDS is gone or stalled; a healthy rank still waiting in the collective is not.
HEARTBEAT_SECONDS = 0.5
ROLL_CALL_SECONDS = 3.0
_heartbeats: set[int] = set()  # the global ranks this process beats for
_heartbeats_lock = threading.Lock()


def _heartbeat_key(global_rank: int) -> str:
    return f"asyncckpt/heartbeat/{global_rank}"


def _start_heartbeat(dist: Any, global_rank: int) -> None:
    """Starts this process's heartbeat (once); nothing when the store cannot be had."""
    with _heartbeats_lock:
        if global_rank in _heartbeats:
            return
        try:
            store = dist.distributed_c10d._get_default_store()  # private: no public accessor
        except Exception:  # noqa: BLE001 - no store: failures are then reported unnamed
            return
        _heartbeats.add(global_rank)

    def beat() -> None:
        while True:
            try:
                store.add(_heartbeat_key(global_rank), 1)
            except Exception:  # noqa: BLE001 - the store's host is gone; nothing to beat on
                return
            time.sleep(HEARTBEAT_SECONDS)

    threading.Thread(target=beat, name="asyncckpt-heartbeat", daemon=True).start()


def _silent_ranks(dist: Any, size: int, global_rank: Callable[[int], int]) -> list[int] | None:
    """After a failed collective: the group ranks whose heartbeat stood still for
    ROLL_CALL_SECONDS, so the error names the rank that died instead of a socket. None when the
    store cannot be reached (its host was the rank that died)."""
    try:
        store = dist.distributed_c10d._get_default_store()  # private: no public accessor
        keys = [_heartbeat_key(global_rank(r)) for r in range(size)]
        before = [store.add(key, 0) for key in keys]
        time.sleep(ROLL_CALL_SECONDS)
        after = [store.add(key, 0) for key in keys]
    except Exception:  # noqa: BLE001 - the store went with the rank that hosted it
        return None
    return [r for r in range(size) if after[r] == before[r]]


def _collective_failure(silent: list[int] | None, error: BaseException) -> str:
    """The message of a failed collective, naming the silent ranks when the roll call found
    them."""
    if silent:
        who = f"rank {silent[0]}" if len(silent) == 1 else \
            "ranks " + ", ".join(str(r) for r in silent)
        return (f"{who} of the job stopped answering (gone, or stalled past "
                f"{ROLL_CALL_SECONDS:g} s): a collective of the save failed: {error}")
    return f"a collective of the save failed, and the job's store did not answer: {error}"


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
