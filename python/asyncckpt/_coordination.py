"""The processes of a job, as the C++ Checkpointer agrees with them: a _core.Coordinator whose
two collectives run on the framework's own machinery, never a protocol of asyncckpt's.

- ``torch_coordinator(group)``: a torch.distributed process group (gloo or NCCL), through
  ``broadcast_object_list`` and ``all_gather_object``; a failed one names the ranks that died,
  found through a heartbeat on torch.distributed's store;
- ``jax_coordinator()``: the processes of ``jax.distributed.initialize``, through its key-value
  store.

The Checkpointer calls them on the thread that saves, at the points every rank reaches in the
same order (each save, wait_until_finished, close); a save's commit agrees through the file
system, so a rank that dies cannot hang the others in a collective of ours beyond the
framework's own timeout.
"""

from __future__ import annotations

import datetime
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from . import _core

T = TypeVar("T")

# A rank that dies between saves fails the survivors' next collective with the transport's own
# error ("Connection closed by peer [127.0.0.1]:port"), which names no rank. So each rank beats
# on the job's store (torch.distributed's key-value store) from a thread of its own, which goes
# on while its training thread waits in a collective; after a failed collective, the ranks whose
# beat was seen and then stood still for ROLL_CALL_SECONDS are named. A rank never seen beating
# is never named: it may merely be late.
HEARTBEAT_SECONDS = 0.5
ROLL_CALL_SECONDS = 3.0
# Bounds the connections of the beat and of the roll call to the store, and each of their calls:
# the exit joins the beat, and neither it nor a failed save may wait the store's own timeout (30
# minutes by default) when the store's host is gone or hangs.
STORE_TIMEOUT_SECONDS = 5.0


class _Heartbeat:
    """This rank's beat: ``add(key, 1)`` every HEARTBEAT_SECONDS on a connection of its own to
    the job's store at ``address``, from a thread that stop() joins and that the interpreter's
    exit stops and joins before it finalizes anything. The thread also makes the roll call's
    connection (``roll_call_store``, None until then), so that a store whose host is gone
    delays no caller, only an exit by at most a failed connection.

    Not a daemon thread: one caught inside a store call (C++, GIL released) when the interpreter
    finalizes is ended by pthread_exit as it takes the GIL back, and that unwinding through
    torch's noexcept frames aborts the process ("terminate called without an active
    exception"). A thread the exit joins is never there."""

    def __init__(self, tcp_store: Any, address: tuple[str, int], key: str) -> None:
        self._tcp_store = tcp_store  # torch.distributed.TCPStore
        self._address = address
        self._key = key
        self.roll_call_store: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="asyncckpt-heartbeat",
                                        daemon=False)

    def start(self) -> bool:
        """Starts the beat; False when the interpreter is already exiting."""
        with _beats_lock:
            global _exit_hook
            if not _exit_hook:
                try:
                    # Runs before the interpreter joins its threads, so before atexit's
                    # functions and torch's teardown.
                    threading._register_atexit(_stop_all)  # type: ignore[attr-defined]
                except RuntimeError:  # the interpreter is exiting: it would not stop the beat
                    return False
                _exit_hook = True
            _beats.add(self)
        self._thread.start()
        return True

    def _beat(self) -> None:
        try:
            store = _connect(self._tcp_store, self._address)
            # Made now, while the store answers: a new connection to a host that has died
            # retries for its whole timeout, an existing one fails at once.
            self.roll_call_store = _connect(self._tcp_store, self._address)
        except Exception:  # noqa: BLE001 - the store's host is gone: nothing to beat on
            return
        while not self._stopping.is_set():
            try:
                store.add(self._key, 1)
            except Exception:  # noqa: BLE001 - the store's host is gone or hangs: a broken
                return  # connection never comes back, and the roll call then names no one
            self._stopping.wait(HEARTBEAT_SECONDS)

    def stop_soon(self) -> None:
        """Ends the beat within one beat, without waiting for it (from a finalizer)."""
        self._stopping.set()

    def stop(self) -> None:
        """Ends the beat and joins its thread: at most one store call's or connection's wait."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


_beats: weakref.WeakSet[_Heartbeat] = weakref.WeakSet()  # a running beat's thread holds it
_beats_lock = threading.Lock()
_exit_hook = False


def _stop_all() -> None:
    """The exit's hook: stops and joins every beat of this process."""
    with _beats_lock:
        beats = list(_beats)
    for beat in beats:
        beat.stop()


def _heartbeat_key(global_rank: int) -> str:
    # A worker restarted by torchrun beats on a key of its own, so a count left by the run
    # before it is not taken for a beat of this one.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"asyncckpt/heartbeat/{restart}/{global_rank}"


def _roll_call(store: Any, keys: list[str], me: int) -> list[int] | None:
    """After a failed collective: the indices of ``keys`` (not ``me``) whose beat was seen and
    then stood still for ROLL_CALL_SECONDS; None when the store does not answer."""
    try:
        first = [int(store.add(key, 0)) for key in keys]
        silent = {i for i, count in enumerate(first) if count > 0 and i != me}
        deadline = time.monotonic() + ROLL_CALL_SECONDS
        while silent:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(HEARTBEAT_SECONDS, left))
            silent = {i for i in silent if int(store.add(keys[i], 0)) == first[i]}
    except Exception:  # noqa: BLE001 - the store went with its host
        return None
    return sorted(silent)


def _gone_message(gone: list[int], error: BaseException) -> str:
    """A failed collective's message naming the ranks found gone, in MPI mode's words."""
    if len(gone) == 1:
        who, its, are = f"rank {gone[0]}", "its heartbeat", "is"
    else:
        who = "ranks " + ", ".join(str(r) for r in gone[:-1]) + f" and {gone[-1]}"
        its, are = "their heartbeats", "are"
    return (f"{who} of the job {are} gone: {its} on torch.distributed's store stood still for "
            f"{ROLL_CALL_SECONDS:g} s after a collective of the save failed (dead, or hung): "
            f"{error}")


class _TorchCoordinator(_core.Coordinator):
    """A torch.distributed process group's coordinator, and this rank's heartbeat while it is
    in use (close() ends it)."""

    def __init__(self, rank: int, size: int, broadcast: Callable[[bytes, int], bytes],
                 all_gather: Callable[[bytes], list[bytes]],
                 heartbeat: _Heartbeat | None) -> None:
        super().__init__(rank, size, broadcast, all_gather)
        self._heartbeat = heartbeat
        if heartbeat is not None:  # a coordinator dropped unclosed stops beating
            weakref.finalize(self, heartbeat.stop_soon)

    def close(self) -> None:
        """Ends this rank's heartbeat: no collective of this coordinator follows."""
        if self._heartbeat is not None:
            self._heartbeat.stop()


def close(coordinator: _core.Coordinator | None) -> None:
    """Ends what ``coordinator`` runs beside its collectives (a torch rank's heartbeat)."""
    if isinstance(coordinator, _TorchCoordinator):
        coordinator.close()


def _connect(tcp_store: Any, address: tuple[str, int]) -> Any:
    """A connection of its own to the TCPStore at ``address``, with STORE_TIMEOUT_SECONDS."""
    return tcp_store(address[0], address[1], None, False,
                     datetime.timedelta(seconds=STORE_TIMEOUT_SECONDS), wait_for_workers=False)


def _start_heartbeat(dist: Any, global_rank: int) -> _Heartbeat | None:
    """This rank's running heartbeat on the job's store; None when that is no TCPStore (a
    failed collective is then reported unnamed)."""
    try:
        store = dist.distributed_c10d._get_default_store()  # private: no public accessor
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        if not isinstance(store, dist.TCPStore):
            return None
        address = (str(store.host), int(store.port))
    except Exception:  # noqa: BLE001 - no default store
        return None
    heartbeat = _Heartbeat(dist.TCPStore, address, _heartbeat_key(global_rank))
    return heartbeat if heartbeat.start() else None


def torch_coordinator(group: Any = None) -> _core.Coordinator:
    """The ranks of torch.distributed process ``group`` (None: the default group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("a process group needs torch.distributed.init_process_group() first")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    global_ranks = [r if group is None else dist.get_global_rank(group, r) for r in range(size)]
    heartbeat = _start_heartbeat(dist, global_ranks[rank])
    keys = [_heartbeat_key(r) for r in global_ranks]
    gone: list[int] = []  # global ranks found gone: a dead rank does not come back

    def naming_the_gone(collective: Callable[[], T]) -> T:
        try:
            return collective()
        except Exception as error:
            roll_call_store = None if heartbeat is None else heartbeat.roll_call_store
            if roll_call_store is None:
                raise
            if not gone:
                silent = _roll_call(roll_call_store, keys, rank)
                if silent is None:
                    raise RuntimeError(
                        "a collective of the save failed, and torch.distributed's store did not "
                        "answer either (its host is gone or hangs: rank 0 hosts it under "
                        f"init_process_group's env:// and tcp://, torchrun's agent else): {error}"
                    ) from error
                gone.extend(global_ranks[i] for i in silent)
            if not gone:
                raise
            raise RuntimeError(_gone_message(gone, error)) from error

    def broadcast(data: bytes, root: int) -> bytes:
        objects: list[Any] = [data if rank == root else None]
        naming_the_gone(lambda: dist.broadcast_object_list(objects, src=global_ranks[root],
                                                           group=group))
        return bytes(objects[0])

    def all_gather(data: bytes) -> list[bytes]:
        gathered: list[Any] = [None] * size
        naming_the_gone(lambda: dist.all_gather_object(gathered, data, group=group))
        return [bytes(item) for item in gathered]

    return _TorchCoordinator(rank, size, broadcast, all_gather, heartbeat)


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
