"""The C++ library's log lines, handed to Python's logging as logger "asyncckpt".

The engine queues its lines (asyncckpt._core.capture_log) instead of printing them on stderr,
each with the level the library gave it: INFO for what it did as it should (retention,
start-up clean-up, a restore, a recovery), WARNING for what is worth a look, ERROR for a failure
or damage (a failed save, a quarantined checkpoint). ``drain()`` passes them on, and the manager
calls it after each of its calls, so a line logged on a background thread reaches logging by
the next step at the latest.
"""

from __future__ import annotations

import logging

from . import _core

logger = logging.getLogger("asyncckpt")


def drain() -> None:
    """Logs every queued line of the library at its level, oldest first."""
    lines, dropped = _core.take_log_lines()
    for level, line in lines:
        logger.log(level, "%s", line)
    if dropped:
        logger.warning("%d log lines of the library were dropped (the queue was full)", dropped)


def capture() -> None:
    """From now on the library's lines go to logging (through drain) instead of stderr."""
    _core.capture_log(True)
