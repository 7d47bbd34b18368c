"""Which checkpoint a resume reads, and what to do when its bytes turn out damaged.

Start-up checks a checkpoint's sizes, not its bytes, so a flipped byte shows only when a restore
reads the chunk: the reader's CheckpointError then starts with "Corruption: " (the C++ status
code). The manager quarantines such a checkpoint and reads the newest good one before it; a
read-only ``asyncckpt.load(directory)`` passes over it without changing anything.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

from . import _core, _logging

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._steps import StepLedger

T = TypeVar("T")


class Nothing:
    """What a read returns when there is no checkpoint to read."""


NOTHING = Nothing()


def is_damage(error: _core.CheckpointError) -> bool:
    """True for damage found while reading (the C++ Corruption: a chunk failing its checksum, a
    chunk that does not decode), as opposed to an I/O error or a newer release's checkpoint."""
    return str(error).startswith("Corruption: ")


def damage_of(error: _core.CheckpointError) -> str:
    """What the reader found wrong, without the status code."""
    return str(error).removeprefix("Corruption: ")


def read_latest_good(core: _core.Checkpointer, ledger: StepLedger,
                     read: Callable[[_core.Reader], T], step: int | None,
                     ) -> tuple[T | Nothing, list[str]]:
    """``read(reader)`` of checkpoint ``step``, or of the manager's latest one, past a latest one
    whose bytes turn out damaged: that one is quarantined and the ledger told. NOTHING when no
    checkpoint is left, with the damage this call found."""
    found: list[str] = []
    if step is not None:
        return read(core.open(step)), found
    while (latest := core.latest_step()) is not None:
        try:
            return read(core.open(latest)), found
        except _core.CheckpointError as error:
            if not is_damage(error):
                raise
            # A flipped byte that start-up's size checks cannot see: every restart would fail
            # on it. Quarantine it and resume the newest good one instead.
            found.append(damage_of(error))
            core.quarantine(latest, damage_of(error))
            ledger.dropped(latest, core.latest_step())
    return NOTHING, found


def refuse_newer_release(directory: str, core: _core.Checkpointer) -> None:
    """CheckpointError when a newer release wrote a checkpoint of ``core``'s basename: no damage
    and no absence, and never a reason to start afresh beside it."""
    basename = os.path.basename(core.checkpoint_path(0)).rsplit("-", 1)[0]
    try:
        _core.find_resume_checkpoints(directory, basename)
    except _core.CheckpointError as error:
        if "newer release" in str(error):
            raise
    except FileNotFoundError:
        pass


def load_from_directory(directory: str, load: Callable[[_core.Reader], T]) -> T:
    """``load`` of the checkpoint a resume in ``directory`` would use; past one whose bytes turn
    out damaged, of the one a resume would fall back to (logged; nothing is quarantined).
    FileNotFoundError when there is none to resume, CheckpointError naming the damage when there
    are only damaged ones."""
    try:
        resume = _core.find_resume_checkpoints(directory)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{directory} is neither a checkpoint nor a directory with one: "
                                f"{error}") from None
    failures = []
    for step in reversed(resume["steps"]):
        candidate = os.path.join(directory, f"{resume['basename']}-{step}")
        try:
            return load(_core.open_reader(candidate))
        except _core.CheckpointError as error:
            if not is_damage(error):
                raise
            failures.append(str(error))
            _logging.logger.error("asyncckpt.load: %s is damaged, trying the checkpoint before "
                                  "it: %s", candidate, damage_of(error))
    raise _core.CheckpointError(f"{directory} has no checkpoint to load, only damaged ones: "
                                + "; ".join(failures))


def latest_checkpoint(directory: str) -> str | None:
    """The path of the checkpoint a resume in ``directory`` would use, or None when there is none
    to resume (CheckpointError when there are only damaged ones)."""
    return _core.latest_checkpoint(directory)
