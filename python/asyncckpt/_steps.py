"""Step numbers: what a step may be, which steps may still be saved, and when one is due.

A checkpoint's name carries its step ("model.ckpt-1000"), and the C++ engine keeps steps as
int64: a step is an ``int`` in [0, 2**63 - 1], checked before anything is written.

Orbax's schedule is here: with ``save_interval_steps=N`` a step is due when ``step % N == 0``,
so the step numbers of the checkpoints are the same in every run and after every restart.
(``save_steps`` keeps TensorFlow's SecondOrStepTimer, which the C++ Checkpointer decides: the
first step seen, then every N steps after the last save.)
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, SupportsIndex

from . import _core

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_STEP = 2**63 - 1


class StepAlreadyExistsError(_core.CheckpointError):
    """A save of the latest saved step, or of a step lower than it.

    Pass ``force=True`` to save it anyway (the same step is then replaced; a lower step becomes
    the latest, a rollback: later saves compare with it).
    """


def _index(value: object, what: str) -> int:
    """``value`` as an int (an int or a NumPy integer; never a bool, never a truncated float),
    or TypeError naming ``what``."""
    if type(value) is int:  # every step of a training loop: no protocol check
        return value
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TypeError(f"{what} must be an int, not a {type(value).__name__} ({value!r})")
    return operator.index(value)


def check_step(step: object) -> int:
    """``step`` as an int; TypeError or ValueError naming it when it cannot be a step."""
    value = _index(step, "step")
    if not 0 <= value <= MAX_STEP:
        raise ValueError(f"step must be in [0, 2**63 - 1], got {value}")
    return value


def check_save_interval_steps(save_interval_steps: object) -> int | None:
    """``save_interval_steps`` as an int >= 1, or None."""
    if save_interval_steps is None:
        return None
    value = _index(save_interval_steps, "save_interval_steps")
    if value < 1:
        raise ValueError(f"save_interval_steps must be positive, got {value}")
    return value


class StepLedger:
    """The latest saved step: the one the last successful save wrote, as the state file records
    it (the manager's latest_step()), and the floor for the next save. A forced save of a lower
    step is a rollback: it becomes the latest, and the steps after it may be saved again."""

    def __init__(self, latest_on_disk: int | None) -> None:
        self.latest = latest_on_disk

    def is_new(self, step: int) -> bool:
        """True when ``step`` is above the latest saved step."""
        return self.latest is None or step > self.latest

    def check_new(self, step: int, force: bool, path_of: Callable[[int], str]) -> None:
        """Raises StepAlreadyExistsError unless ``step`` is new or ``force``."""
        if force or self.is_new(step):
            return
        if step == self.latest:
            raise StepAlreadyExistsError(f"step {step} is already saved ({path_of(step)}); "
                                         "pass force=True to replace it")
        raise StepAlreadyExistsError(f"step {step} is lower than the latest saved step "
                                     f"{self.latest}; pass force=True to save it anyway (a "
                                     "rollback: it becomes the latest)")

    def saved(self, step: int) -> None:
        """Records a save of ``step``: it is the latest now, also when forced lower."""
        self.latest = step

    def dropped(self, step: int, latest_now: int | None) -> None:
        """Records that checkpoint ``step`` left the list (quarantined as damaged): when it was
        the latest, the latest is now ``latest_now``, and ``step`` may be saved again."""
        if self.latest == step:
            self.latest = latest_now
