"""What each save did: SaveStats, Stats, and SaveFuture, the handle a save returns.

The C++ Checkpointer finishes saves in the order they were made and keeps the stats of the
most recent ones (SaverTotals.saves). The manager's SaveTracker numbers its saves 1, 2, ...;
the n-th is done once n saves have finished (saves_committed + saves_failed), and its stats are
then the entry of the totals' window that n names. The tracker reads them at every manager call
(a save is a call, so none leaves the window unread), and a future waits for its own save in
C++ with the GIL released.

A manager may hand a save to the engine on a thread of its own (asyncckpt.jax on the CPU): the
save is made (numbered, its future returned) before the engine has it. Until that hand-off ends,
waits wait for it first; a hand-off that fails never reaches the engine, so its number is
withdrawn and its future gets the error, else a wait for it would never end.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from typing import TYPE_CHECKING

from . import _core

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class SaveStats:
    """What one save did (the C++ SaveStats). Times in seconds."""

    step: int
    path: str  #: the committed checkpoint directory ("" when the save failed before its commit)
    ok: bool
    error: str | None  #: why it failed, or None
    bytes_raw: int  #: bytes of tensor data
    bytes_stored: int  #: bytes written to data files
    chunks_by_codec: dict[str, int]  #: chunks written per codec ("raw", "zstd", "shuffle+zstd")
    final_level: int  #: zstd level at the end of the save (the engine may lower it under load)
    switched_to_raw: bool  #: the engine stored the rest raw because encoding was the bottleneck
    blocked_seconds: float  #: time the training thread was blocked by this save
    seconds_to_durable: float  #: from the start of the save until it was durable and committed


@dataclasses.dataclass(frozen=True)
class Stats:
    """Totals over a manager's life, and the SaveStats of its recent saves in step order."""

    saves_committed: int
    saves_failed: int
    saves_skipped: int  #: maybe_save skipped because staging was busy (on_busy="skip")
    blocked_seconds_total: float
    blocked_seconds_max: float
    bytes_raw: int
    bytes_stored: int
    staging_high_water_bytes: int
    stale_temporaries_removed: list[str]  #: temporaries of interrupted saves removed at start
    saves: list[SaveStats]  #: the most recent (at most 128)
    startup_seconds: float = 0.0  #: creating engines and pinned staging (prepare or a save)


def stats_of(totals: _core.TotalsDict) -> Stats:
    """The Stats of the C++ totals."""
    return Stats(
        saves_committed=totals["saves_committed"], saves_failed=totals["saves_failed"],
        saves_skipped=totals["saves_skipped"],
        blocked_seconds_total=totals["blocked_seconds_total"],
        blocked_seconds_max=totals["blocked_seconds_max"], bytes_raw=totals["bytes_raw"],
        bytes_stored=totals["bytes_stored"],
        staging_high_water_bytes=totals["staging_high_water_bytes"],
        stale_temporaries_removed=totals["stale_temporaries_removed"],
        saves=[SaveStats(**save) for save in totals["saves"]],
        startup_seconds=totals["startup_seconds"])


class SaveFuture:
    """The outcome of one save, as ``concurrent.futures.Future`` gives one.

    ``done()`` says whether the save is durable or failed; ``result(timeout)`` waits for it and
    returns its SaveStats, or raises the save's own CheckpointError (TimeoutError when the
    timeout passes first); ``stats`` is the SaveStats once done, else None. A synchronous save's
    future is done when ``save`` returns. Any thread may wait on it.
    """

    def __init__(self, tracker: SaveTracker, ordinal: int, step: int) -> None:
        self._tracker = tracker
        self._ordinal = ordinal
        self.step = step  #: the step this save wrote
        self._stats: SaveStats | None = None
        self._error: BaseException | None = None  # a hand-off that failed
        self._resolved = threading.Event()

    def __repr__(self) -> str:
        state = "pending" if not self._resolved.is_set() else (
            "ok" if self._stats is not None and self._stats.ok else "failed")
        return f"<SaveFuture step={self.step} {state}>"

    @property
    def stats(self) -> SaveStats | None:
        """The save's SaveStats once it is done, else None."""
        if not self._resolved.is_set():
            self._tracker.poll(self._ordinal, 0)
        return self._stats

    def done(self) -> bool:
        """True once the save is durable and committed, or failed."""
        return self._resolved.is_set() or self._tracker.poll(self._ordinal, 0)

    def result(self, timeout: float | None = None) -> SaveStats:
        """Waits up to ``timeout`` seconds (None: as long as it takes) for the save; returns its
        SaveStats, or raises its CheckpointError, or TimeoutError."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        assert self._stats is not None
        return self._stats

    def exception(self, timeout: float | None = None) -> _core.CheckpointError | None:
        """Waits as ``result`` does; the save's CheckpointError, or None when it committed."""
        if not self._resolved.is_set() and not self._tracker.poll(
                self._ordinal, -1.0 if timeout is None else max(0.0, timeout)):
            raise TimeoutError(f"the save of step {self.step} is still in progress after "
                               f"{timeout} s")
        if self._error is not None:
            if isinstance(self._error, _core.CheckpointError):
                return self._error
            error = _core.CheckpointError(f"the save of step {self.step} failed: {self._error}")
            error.__cause__ = self._error
            return error
        if self._stats is None:
            return _core.CheckpointError(
                f"the save of step {self.step} finished, but its stats are no longer kept (the "
                "manager keeps the most recent 128)")
        if not self._stats.ok:
            return _core.CheckpointError(self._stats.error or f"the save of step {self.step} "
                                         "failed")
        return None

    def _resolve(self, stats: SaveStats | None) -> None:
        self._stats = stats
        self._resolved.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._resolved.set()


class SaveTracker:
    """Numbers a manager's saves and hands each finished one's stats to its future."""

    def __init__(self, core: _core.Checkpointer) -> None:
        self._core = core
        self._lock = threading.Lock()
        self._made = 0  # saves handed to the engine so far
        self._read = 0  # finished saves whose stats were read so far
        self._pending: weakref.WeakValueDictionary[int, SaveFuture] = (
            weakref.WeakValueDictionary())
        self._failed: list[SaveStats] = []  # read, not yet taken by the manager
        self._handed = threading.Event()  # clear while the last save made is being handed over
        self._handed.set()

    def made(self, step: int) -> SaveFuture:
        """The future of the save of ``step`` just handed to the engine."""
        with self._lock:
            self._made += 1
            future = SaveFuture(self, self._made, step)
            self._pending[self._made] = future
        self.read()
        return future

    def handing_over(self) -> None:
        """The save just made goes to the engine on another thread; handed_over ends it."""
        self._handed.clear()

    def handed_over(self, future: SaveFuture, error: BaseException | None) -> None:
        """The hand-off of ``future``'s save (the last one made) ended; with ``error`` it never
        reached the engine: its number is withdrawn (the engine counts the saves it got) and its
        future fails with ``error``."""
        if error is not None:
            with self._lock:
                if self._made == future._ordinal:
                    self._made -= 1
                self._pending.pop(future._ordinal, None)
            future._fail(error)
        self._handed.set()

    def poll(self, ordinal: int, timeout_seconds: float) -> bool:
        """Whether save ``ordinal`` is done, waiting up to ``timeout_seconds`` (< 0: no limit);
        when it is, its future is resolved."""
        deadline = time.monotonic() + timeout_seconds
        if not self._handed.wait(None if timeout_seconds < 0 else timeout_seconds):
            return False
        with self._lock:
            if ordinal > self._made:  # withdrawn: its future failed already
                return True
        left = -1.0 if timeout_seconds < 0 else max(0.0, deadline - time.monotonic())
        if not self._core.wait_for_finished_saves(ordinal, left):
            return False
        self.read()
        return True

    def wait_all(self) -> None:
        """Waits until every save handed to the engine so far has finished (committed or
        failed); each rank waits for its own view, with no collective."""
        self._handed.wait()
        with self._lock:
            made = self._made
        if made > self._read:
            self.poll(made, -1)

    def read(self) -> None:
        """Resolves the futures of the saves finished since the last read, and keeps the stats
        of those that failed for take_failed."""
        totals = self._core.totals()
        with self._lock:
            finished = totals["saves_committed"] + totals["saves_failed"]
            window: Sequence[_core.SaveStatsDict] = totals["saves"]
            first_kept = finished - len(window) + 1  # the ordinal of window[0]
            for ordinal in range(self._read + 1, finished + 1):
                stats = (SaveStats(**window[ordinal - first_kept]) if ordinal >= first_kept
                         else None)
                future = self._pending.pop(ordinal, None)
                if future is not None:
                    future._resolve(stats)
                if stats is not None and not stats.ok:
                    self._failed.append(stats)
            self._read = max(self._read, finished)

    def take_failed(self) -> list[SaveStats]:
        """The failed saves read so far and not taken yet, in the order they finished."""
        self.read()
        with self._lock:
            failed, self._failed = self._failed, []
        return failed
