"""Stateful objects in a state, as torch.distributed.checkpoint (DCP) treats them.

Any object with ``state_dict()`` and ``load_state_dict()`` (``nn.Module``, ``Optimizer``, LR
schedulers, a user's class) may sit in a state where a tensor or value could. A save stores its
``state_dict()``; a restore fills a fresh ``state_dict()`` of it from the checkpoint and hands
the result to its ``load_state_dict()``. A ``load()`` returns the stored dicts.

Entries of a state dict that are methods bound to the object itself are left out: they are
code, rebuilt by the object's constructor, not state (torch < 2.2's ``OneCycleLR`` keeps its
``anneal_func`` so, and its ``load_state_dict`` leaves an entry it is not given alone).
"""

import collections
import contextlib
import inspect

from . import _tree


def is_stateful(value):
    """True for an object DCP would call state_dict() / load_state_dict() on."""
    if isinstance(value, (dict, list, tuple)):
        return False
    return (callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))


def state_dict_of(obj):
    """``obj.state_dict()`` without the methods bound to ``obj``."""
    state = obj.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"{type(obj).__qualname__}.state_dict() returned a "
                        f"{type(state).__name__}, not a dict")
    bound = [key for key, value in state.items()
             if inspect.ismethod(value) and value.__self__ is obj]
    if not bound:
        return state
    kept = type(state)((key, value) for key, value in state.items() if key not in bound)
    if hasattr(state, "_metadata"):
        kept._metadata = state._metadata
    return kept


def saveable(value, names=None, active=None):
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


def _saveable_container(value, names, active):
    if isinstance(value, dict):
        items = [(key, saveable(child, names + [str(key)], active))
                 for key, child in value.items()]
        if all(new is value[key] for key, new in items):
            return value
        out = collections.OrderedDict(items) if type(value) is collections.OrderedDict else (
            dict(items))
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata
        return out
    if type(value) in (list, tuple):
        items = [saveable(child, names + [str(i)], active) for i, child in enumerate(value)]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if type(value) is list else tuple(items)
    return value


def _swap_in(value, swapped, names=None, active=None):
    """Puts each stateful object's state dict in its place (dicts and lists, in place), bounded
    as the tree's flatten is: a cycle or a state nested too deep is a ValueError."""
    if isinstance(value, dict):
        positions = value.items()
    elif isinstance(value, list):
        positions = enumerate(value)
    else:
        if isinstance(value, tuple) and any(is_stateful(v) for v in value):
            raise TypeError("a stateful object inside a tuple cannot be restored in place; "
                            "put it in a dict or list")
        return
    names = [] if names is None else names
    active = set() if active is None else active
    _tree.enter_container(value, names, active)
    try:
        for key, child in list(positions):
            if is_stateful(child):
                value[key] = state_dict_of(child)
                swapped.append((value, key, child))
            else:
                _swap_in(child, swapped, names + [str(key)], active)
    finally:
        active.discard(id(value))


@contextlib.contextmanager
def restoring(state):
    """Within: ``state`` holds each stateful object's state dict in its place, to be filled.
    On a normal exit each object gets ``load_state_dict()`` of the filled dict; always, the
    objects are put back."""
    swapped = []
    try:
        _swap_in(state, swapped)
        yield
        for container, key, obj in swapped:
            obj.load_state_dict(container[key])
    finally:
        for container, key, obj in swapped:
            container[key] = obj
