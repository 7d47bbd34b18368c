"""Values with no exact stored form, kept with pickle only when the caller allows it.

Loading a pickle runs whatever code the pickle names, so a checkpoint directory that someone
else could write would be a way into the training job. Both sides therefore need the flag:
``save(..., allow_pickle=True)`` to store such a value, and ``restore`` / ``load`` with
``allow_pickle=True`` to read it back (without it they refuse, naming the value, and run
nothing). Tensors, arrays and the plain values never go through pickle.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import pickle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._tree import Node

_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("asyncckpt_allow_pickle",
                                                                default=False)


@contextlib.contextmanager
def allowed(allow: bool) -> Iterator[None]:
    """Within: pickled values may be written and read as ``allow`` says."""
    token = _allowed.set(bool(allow))
    try:
        yield
    finally:
        _allowed.reset(token)


def encode(value: object, where: str) -> Node | None:
    """The node of a pickled value, or None when pickling is not allowed."""
    if not _allowed.get():
        return None
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - any failure to pickle is the caller's value
        raise TypeError(f"the value at {where} cannot be pickled: {error}") from None
    return {"p": base64.b64encode(data).decode("ascii")}


def decode(node: Node, where: str) -> object:
    """The value of a pickled node; ValueError unless pickles may be read."""
    if not _allowed.get():
        raise ValueError(f"the checkpoint holds a pickled value at {where}; loading a pickle "
                         "runs code, so pass allow_pickle=True only for checkpoints you trust")
    return pickle.loads(base64.b64decode(node["p"]))
