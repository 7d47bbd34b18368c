"""Metrics and metadata of one step, stored in its checkpoint's metadata as JSON.

``save(step, state, metrics=..., metadata=...)`` stores them under the keys below (the index's
user metadata, which ``asyncckpt inspect`` prints); ``CheckpointManager.metadata(step)`` reads
them back. Values are JSON (numbers, strings, bools, None, lists, dicts with string keys); a
metric may be NaN or infinite, as a loss can be.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

METRICS_KEY = "asyncckpt.python.metrics"
METADATA_KEY = "asyncckpt.python.metadata"
_MAX_BYTES = 512 * 1024  # under the format's 1 MiB per metadata value


@dataclasses.dataclass(frozen=True)
class StepMetadata:
    """What a checkpoint says about its step."""

    step: int
    path: str  #: the checkpoint directory
    wall_time: float  #: when the save started, in seconds since the epoch
    metrics: dict[str, Any] | None  #: as given to save(metrics=...), or None
    metadata: dict[str, Any] | None  #: as given to save(metadata=...), or None


def _encode_one(what: str, values: Mapping[str, object] | None) -> dict[str, str]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a dict, not a {type(values).__name__}")
    for key in values:
        if not isinstance(key, str):
            raise TypeError(f"{what} keys must be str, not {type(key).__name__} ({key!r})")
    try:
        text = json.dumps(dict(values), sort_keys=True, allow_nan=True)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must hold JSON values: {error}") from None
    if len(text.encode()) > _MAX_BYTES:
        raise ValueError(f"{what} take {len(text.encode())} bytes as JSON; at most {_MAX_BYTES}")
    return {METRICS_KEY if what == "metrics" else METADATA_KEY: text}


def encode(metrics: Mapping[str, object] | None,
           metadata: Mapping[str, object] | None) -> dict[str, str]:
    """The user-metadata entries that hold ``metrics`` and ``metadata`` (checked: TypeError or
    ValueError naming which, before anything is written)."""
    return {**_encode_one("metrics", metrics), **_encode_one("metadata", metadata)}


def decode(step: int, path: str, wall_time: float,
           user_metadata: Mapping[str, str]) -> StepMetadata:
    """The StepMetadata of a checkpoint whose user metadata is ``user_metadata``."""
    def parsed(key: str) -> dict[str, Any] | None:
        text = user_metadata.get(key)
        return None if text is None else dict(json.loads(text))
    return StepMetadata(step=step, path=path, wall_time=wall_time, metrics=parsed(METRICS_KEY),
                        metadata=parsed(METADATA_KEY))

