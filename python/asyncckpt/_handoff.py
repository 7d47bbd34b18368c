"""A save handed to the C++ engine on a thread of its own, so that ``save`` returns at once.

asyncckpt.jax uses it on the CPU platform, where what a save holds of each jax.Array is a view
of its device buffer that stays unchanged while held (asyncckpt._jax_tree): gathering the shards
into staging and the engine's copy of them into its own staging then need not run on the
training thread. One hand-off runs at a time. The engine's calls are for one thread at a time,
so every other call of the manager into the engine waits for the hand-off first
(``EngineAfterHandoff``), as does the next save (``settle``).

A hand-off that fails (the engine refused the save: bad input, a closed or stopped
checkpointer) never reached the engine: its future gets the error (SaveTracker.handed_over),
the step is no longer counted as saved, and ``settle`` raises the error once, at the next save,
maybe_save, wait_until_finished or close, as a failed background save is raised.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from . import _core, _saves, _steps


class Handoff:
    """The hand-off of a manager's saves: queued by its ``_hand_over``, started once the save's
    future exists, waited for by ``join``."""

    def __init__(self, saves: _saves.SaveTracker, ledger: _steps.StepLedger) -> None:
        self._saves = saves
        self._ledger = ledger
        self._queued: tuple[Callable[[], object], int | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # of the last hand-off, not raised yet

    def queue(self, work: Callable[[], object], previous_latest: int | None) -> None:
        """``work`` hands the next save over; ``previous_latest`` is the latest saved step
        before it (the latest again if it fails)."""
        self._queued = (work, previous_latest)

    def drop_queued(self) -> None:
        """Forgets a queued hand-off whose save was not made after all."""
        self._queued = None

    def start(self, future: _saves.SaveFuture) -> bool:
        """Starts the queued hand-off of the save ``future`` stands for; False when none was
        queued (the save was handed over on the calling thread)."""
        if self._queued is None:
            return False
        (work, previous_latest), self._queued = self._queued, None
        self._saves.handing_over()
        self._thread = threading.Thread(target=self._run, name="asyncckpt-handoff",
                                        args=(work, future, previous_latest))
        self._thread.start()
        return True

    def _run(self, work: Callable[[], object], future: _saves.SaveFuture,
             previous_latest: int | None) -> None:
        error: BaseException | None = None
        try:
            work()
        except Exception as failure:  # noqa: BLE001 - handed to the future and to settle
            error = failure
            if self._ledger.latest == future.step:
                self._ledger.latest = previous_latest
            self._error = error
        finally:
            self._saves.handed_over(future, error)

    def busy(self) -> bool:
        """Whether a hand-off is under way."""
        return self._thread is not None and self._thread.is_alive()

    def join(self) -> None:
        """Waits for the hand-off under way, if any (without the GIL)."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None

    def settle(self) -> None:
        """``join``, then raises the error of a failed hand-off, once."""
        self.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


# The engine's calls that are safe beside a hand-off (thread-safe in the C++ Checkpointer).
_NO_WAIT = frozenset({"checkpoint_path", "totals", "wait_for_finished_saves"})


class EngineAfterHandoff:
    """The manager's C++ Checkpointer, whose calls first wait for the hand-off under way: they
    are for one thread at a time, and one that holds the GIL while it waits for the lock
    (check_due) would otherwise stall every Python thread behind the hand-off."""

    def __init__(self, core: _core.Checkpointer, handoff: Handoff) -> None:
        self._core = core
        self._handoff = handoff

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._core, name)
        if name in _NO_WAIT or not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def after_handoff(*args: Any, **kwargs: Any) -> Any:
            self._handoff.join()
            return attribute(*args, **kwargs)

        return after_handoff
