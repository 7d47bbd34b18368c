"""Stateful objects in a state, as torch.distributed.checkpoint (DCP) treats them.

Any object with ``state_dict()`` and ``load_state_dict()`` (``nn.Module``, ``Optimizer``, LR
schedulers, a user's class) may sit in a state where a tensor or value could. A save stores its
``state_dict()``; a restore fills a fresh ``state_dict()`` of it from the checkpoint and hands
the result to its ``load_state_dict()``. A ``load()`` returns the stored dicts.

Entries of a state dict that are methods bound to the object itself are left out: they are
code, rebuilt by the object's constructor, not state (torch < 2.2's ``OneCycleLR`` keeps its
``anneal_func`` so, and its ``load_state_dict`` leaves an entry it is not given alone).
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from typing import TYPE_CHECKING, Any, Protocol

from . import _tree

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import TypeGuard


class Stateful(Protocol):
    """What DCP calls a stateful object: it gives and takes its state as a dict."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state."""

    def load_state_dict(self, state_dict: dict[str, Any], /) -> object:
        """Takes the state back."""


def is_stateful(value: object) -> TypeGuard[Stateful]:
    """True for an object DCP would call state_dict() / load_state_dict() on."""
    if isinstance(value, (dict, list, tuple)):
        return False
    return (callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))


def state_dict_of(obj: Stateful) -> dict[str, Any]:
    """``obj.state_dict()`` without the methods bound to ``obj``."""
    state: object = obj.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"{type(obj).__qualname__}.state_dict() returned a "
                        f"{type(state).__name__}, not a dict")
    bound = [key for key, value in state.items()
             if inspect.ismethod(value) and value.__self__ is obj]
    if not bound:
        return state
    kept = type(state)((key, value) for key, value in state.items() if key not in bound)
    _tree.copy_versions(state, kept)
    return kept


def saveable(value: object, names: list[str] | None = None,
             active: set[int] | None = None) -> object:
    """``value`` with every stateful object replaced by its state dict (containers copied only
    where one is replaced; the caller's state is not changed). Bounded as the tree's flatten is:
    a cycle or a state nested too deep is a ValueError, not a RecursionError."""
    if is_stateful(value):
        return state_dict_of(value)
    if not isinstance(value, (dict, list, tuple)):
        return value
    names = [] if names is None else names
    active = set() if active is None else active
    _tree.enter_container(value, names, active)
    try:
        return _saveable_container(value, names, active)
    finally:
        active.discard(id(value))


def _saveable_container(value: dict[Any, Any] | list[Any] | tuple[Any, ...], names: list[str],
                        active: set[int]) -> object:
    if isinstance(value, dict):
        items = [(key, saveable(child, names + [str(key)], active))
                 for key, child in value.items()]
        if all(new is value[key] for key, new in items):
            return value
        out = collections.OrderedDict(items) if type(value) is collections.OrderedDict else (
            dict(items))
        _tree.copy_versions(value, out)
        return out
    if type(value) in (list, tuple):
        children = [saveable(child, names + [str(i)], active) for i, child in enumerate(value)]
        if all(new is old for new, old in zip(children, value)):
            return value
        return children if type(value) is list else tuple(children)
    return value


def _swap_in(value: object, swapped: list[tuple[dict[Any, Any] | list[Any], Any, Stateful]],
             names: list[str] | None = None, active: set[int] | None = None) -> None:
    """Puts each stateful object's state dict in its place (dicts and lists, in place), bounded
    as the tree's flatten is: a cycle or a state nested too deep is a ValueError."""
    positions: list[tuple[Any, object]]
    if isinstance(value, dict):
        positions = list(value.items())
    elif isinstance(value, list):
        positions = list(enumerate(value))
    else:
        if isinstance(value, tuple) and any(is_stateful(v) for v in value):
            raise TypeError("a stateful object inside a tuple cannot be restored in place; "
                            "put it in a dict or list")
        return
    names = [] if names is None else names
    active = set() if active is None else active
    _tree.enter_container(value, names, active)
    try:
        for key, child in positions:
            if is_stateful(child):
                _init_optimizer_state(child)
                value[key] = state_dict_of(child)
                swapped.append((value, key, child))
            else:
                _swap_in(child, swapped, names + [str(key)], active)
    finally:
        active.discard(id(value))


def _init_optimizer_state(obj: object) -> None:
    """Gives a fresh torch optimizer of DTensor parameters (FSDP2) its state as DCP's
    set_state_dict does: one step with zero gradients and a learning rate of 0, which changes no
    parameter. Its state_dict() is empty until then, so a restore would build whole plain
    tensors where its step expects DTensor shards like its parameters."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.optim.Optimizer) or obj.state:
        return
    params = [p for group in obj.param_groups for p in group["params"] if p.requires_grad]
    if not any(type(p).__name__ == "DTensor" for p in params):
        return  # plain parameters: the checkpoint's whole tensors are what the optimizer holds
    if any(p.grad is not None for p in params):
        return  # gradients of the user's own: not ours to replace
    learning_rates = [group.get("lr") for group in obj.param_groups]
    try:
        for group in obj.param_groups:
            if "lr" in group:
                group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        obj.step()
    finally:
        for group, learning_rate in zip(obj.param_groups, learning_rates):
            if learning_rate is not None:
                group["lr"] = learning_rate
        for p in params:
            p.grad = None


@contextlib.contextmanager
def restoring(state: dict[Any, Any] | list[Any]) -> Iterator[set[int]]:
    """Within: ``state`` holds each stateful object's state dict in its place, to be filled;
    yields the ids of those dicts. On a normal exit each object gets ``load_state_dict()`` of
    the filled dict; always, the objects are put back."""
    swapped: list[tuple[dict[Any, Any] | list[Any], Any, Stateful]] = []
    try:
        _swap_in(state, swapped)
        yield {id(container[key]) for container, key, _ in swapped}
        for container, key, obj in swapped:
            obj.load_state_dict(container[key])
    finally:
        for container, key, obj in swapped:
            container[key] = obj
