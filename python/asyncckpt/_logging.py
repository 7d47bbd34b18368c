"""The C++ library's log lines, handed to Python's logging as logger "asyncckpt".

The engine queues its lines (asyncckpt._core.capture_log) instead of printing them on stderr;
``drain()`` passes them on, and the manager calls it after each of its calls, so a line
logged on a background thread reaches logging by the next step at the latest. Retention and
recovery are INFO; problems (failures, skipped saves, anything the library warns about) are
WARNING, so that ``logging.getLogger("asyncckpt").setLevel(logging.WARNING)`` keeps only those.
"""

from __future__ import annotations

import logging

from . import _core

logger = logging.getLogger("asyncckpt")

# Lines that report what the library did as it should: retention, start-up clean-up, recovery.
_INFO_PREFIXES = (
    "retention removed ",
    "removed ",
    "start-up kept ",
    "restored ",
    "starting from step 0",
    "no step of ",
    "state file ",
)


def level_of(line: str) -> int:
    """INFO for retention and recovery, WARNING for everything else."""
    if line.lower().startswith("warning") or "failed" in line or "could not" in line:
        return logging.WARNING
    return logging.INFO if line.startswith(_INFO_PREFIXES) else logging.WARNING


def drain() -> None:
    """Logs every queued line of the library, oldest first."""
    lines, dropped = _core.take_log_lines()
    for line in lines:
        logger.log(level_of(line), "%s", line)
    if dropped:
        logger.warning("%d log lines of the library were dropped (the queue was full)", dropped)


def capture() -> None:
    """From now on the library's lines go to logging (through drain) instead of stderr."""
    _core.capture_log(True)
