"""JAX pytrees <-> the tree of leaves that every manager saves (asyncckpt.jax's machinery).

A pytree's containers become the tree's own: dicts stay dicts, lists lists, tuples tuples, and
any other pytree node (a namedtuple, a registered class) a dict keyed by its children's keys
(a field name, an index). So the checkpoint holds the same tree whichever library saved it, and
``asyncckpt.load`` reads it without JAX.

A ``jax.Array`` becomes one tensor named by its path, described by its global shape and dtype
(node kind "jax"). Each process stores the part it addresses: the union of its addressable
shards, which must be one box of the global array; replicas (shards with the same index, on
this process or another) are written once, by the lowest rank holding them (the C++ engine's
rule). On restore each process reads the boxes its target sharding asks for, whatever the
sharding that was saved.

On the CPU platform a shard's ``np.asarray`` is a view of the device buffer itself, no copy. The
view is an external reference to the buffer, and while one is held JAX neither donates the
buffer (a jitted step with ``donate_argnums`` computes into new memory instead) nor frees it
(``delete()`` leaves the memory to the view): so a view taken at the save is the state as it
was, for as long as it is held (tests/python/test_jax.py proves both). A save there may gather
the shards into staging later, on another thread (``Gathers``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _dtypes, _tree

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import jax

    Box = tuple[tuple[int, ...], tuple[int, ...]]  # (first index, extent) per dimension


def is_jax_array(value: object) -> bool:
    """True for a jax.Array; never imports JAX (a program without it holds none)."""
    import sys

    jax_module = sys.modules.get("jax")
    return jax_module is not None and isinstance(value, jax_module.Array)


def key_component(key: object) -> str | int:
    """The dict key under which a pytree child is stored: a dict's key, an attribute's name, a
    sequence's index."""
    from jax import tree_util

    if isinstance(key, tree_util.DictKey):
        if type(key.key) not in (str, int):
            raise TypeError(f"a pytree dict has a key {key.key!r} of type "
                            f"{type(key.key).__name__}; asyncckpt stores str and int keys only")
        component: str | int = key.key
        return component
    if isinstance(key, tree_util.GetAttrKey):
        name: str = key.name
        return name
    if isinstance(key, tree_util.SequenceKey):
        index: int = key.idx
        return index
    if isinstance(key, tree_util.FlattenedIndexKey):
        flat_index: int = key.key
        return flat_index
    raise TypeError(f"a pytree key {key!r} of type {type(key).__name__}, which asyncckpt cannot "
                    "name")


def _children(node: object) -> list[tuple[object, object]] | None:
    """(key, child) of a registered pytree node one level down; None for a leaf."""
    from jax import tree_util

    flat, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if len(flat) == 1 and flat[0][0] == () and flat[0][1] is node:
        return None
    return [(cast("tuple[object, ...]", path)[0], child) for path, child in flat]


def to_plain(tree: object) -> object:
    """``tree`` with its pytree nodes as dicts, lists and tuples (leaves untouched)."""
    if isinstance(tree, dict):
        pairs = [(key, to_plain(child)) for key, child in tree.items()]
        return (collections.OrderedDict(pairs) if type(tree) is collections.OrderedDict
                else dict(pairs))
    if type(tree) is list or type(tree) is tuple:
        items = [to_plain(child) for child in cast("list[object]", tree)]
        return items if type(tree) is list else tuple(items)
    if tree is None or is_jax_array(tree) or isinstance(tree, np.ndarray):
        return tree
    from . import _stateful

    if _stateful.is_stateful(tree):
        return tree
    children = _children(tree)
    if children is None:
        return tree
    return {key_component(key): to_plain(child) for key, child in children}


# ---- saving ----------------------------------------------------------------------------------


def box_of(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    """(first index, extent) per dimension of the part of an array an index selects."""
    first = []
    extent = []
    for part, size in zip(index, shape):
        start, stop, _ = part.indices(size)
        first.append(start)
        extent.append(stop - start)
    return tuple(first), tuple(extent)


def bounding_box(boxes: set[Box], rank: int) -> Box:
    """The smallest box that holds every one of ``boxes`` (of arrays of ``rank`` dimensions)."""
    lows = [min(first[d] for first, _ in boxes) for d in range(rank)]
    highs = [max(first[d] + extent[d] for first, extent in boxes) for d in range(rank)]
    return tuple(lows), tuple(h - lo for h, lo in zip(highs, lows))


def tiles(boxes: set[Box], bounding: Box) -> bool:
    """Whether distinct, disjoint ``boxes`` (a sharding's) fill ``bounding`` exactly."""
    return sum(math.prod(extent) for _, extent in boxes) == math.prod(bounding[1])


def process_box(array: jax.Array, where: str) -> Box:
    """The box of ``array`` that this process addresses: its unique shards, which must tile one
    box (ValueError naming the leaf otherwise)."""
    shape = tuple(array.shape)
    boxes = {box_of(shard.index, shape) for shard in array.addressable_shards}
    bounding = bounding_box(boxes, len(shape))
    if not tiles(boxes, bounding):
        raise ValueError(f"array at {where}: the shards this process addresses do not form one "
                         f"box of its global shape {shape} (boxes {sorted(boxes)}); use a "
                         "sharding whose devices on each process hold one contiguous block")
    return bounding


class HostStaging:
    """Host buffers that the shards of a process's box are gathered into, one per tensor name,
    kept across saves so a save allocates nothing once the state's shapes are seen."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray[Any, Any]] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any,
                                                                                            Any]:
        """The buffer of ``name``, made anew only when its shape or dtype changed."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = np.empty(shape, dtype=dtype)
            self._buffers[name] = buffer
        return buffer

    def drop_unused(self, names: set[str]) -> None:
        """Frees the buffers of tensors no longer in the state."""
        for name in set(self._buffers) - names:
            del self._buffers[name]


class Gathers:
    """Copies of shards into staging left for later (``run``): each source is the view of a CPU
    device buffer, which it keeps alive and unchanged until run (see the module's docstring)."""

    def __init__(self) -> None:
        self._copies: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []

    def add(self, destination: np.ndarray[Any, Any], source: np.ndarray[Any, Any]) -> None:
        self._copies.append((destination, source))

    def run(self) -> None:
        """Makes the copies (NumPy drops the GIL for them) and lets the views go."""
        copies, self._copies = self._copies, []
        for destination, source in copies:
            np.copyto(destination, source)


@dataclasses.dataclass
class _Save:
    """The save under way on this thread: where shards are gathered, the gathers left for
    later (None: gathered at once), and the names of the tensors that jax.Arrays became."""

    staging: HostStaging
    later: Gathers | None
    jax_names: set[str] = dataclasses.field(default_factory=set)


# The save under way on this thread (saves on several threads keep theirs).
_current_save: contextvars.ContextVar[_Save | None] = contextvars.ContextVar(
    "asyncckpt_jax_save", default=None)


def on_cpu(array: jax.Array) -> bool:
    """Whether every shard this process holds of ``array`` is on the CPU platform, where the
    host view of a shard is the device buffer itself."""
    # getattr: jaxlib's stubs leave Device.platform out.
    return all(getattr(device, "platform", None) == "cpu"
               for device in array.sharding.addressable_devices)


def _host_part(array: jax.Array, name: str, box: Box) -> np.ndarray[Any, Any]:
    """The host bytes of ``box``: a view of the one shard that covers it, or the shards gathered
    into the staging buffer of ``name`` (now, or by the save's Gathers)."""
    shape = tuple(array.shape)
    first, extent = box
    unique: dict[Box, Any] = {}
    for shard in array.addressable_shards:
        unique.setdefault(box_of(shard.index, shape), shard)
    if len(unique) == 1:
        return np.asarray(next(iter(unique.values())).data)
    save = _current_save.get() or _Save(HostStaging(), None)
    buffer = save.staging.buffer(name, extent, np.dtype(array.dtype))
    for (shard_first, shard_extent), shard in unique.items():
        where = tuple(slice(f - b, f - b + e) for f, b, e in zip(shard_first, first, shard_extent))
        if save.later is not None:
            save.later.add(buffer[where], np.asarray(shard.data))
        else:
            buffer[where] = np.asarray(shard.data)
    return buffer


def jax_leaf(value: object, names: list[str]) -> tuple[_tree.Leaf, _tree.Node] | None:
    """The leaf and node of a jax.Array (its process's box); None for anything else."""
    if not is_jax_array(value):
        return None
    array: jax.Array = value  # type: ignore[assignment]
    where = "'" + "/".join(names) + "'"
    canonical = np.dtype(array.dtype).name
    stored, is_complex = _dtypes.stored_form(canonical, f"array at {where}")
    name = "/".join(names)
    global_shape = [int(n) for n in array.shape]
    # Whole on every process (one process, or replicated): no box, rank 0 writes it.
    sharded = not (array.is_fully_addressable or array.sharding.is_fully_replicated)
    box = process_box(array, where) if sharded else (
        (0,) * len(global_shape), tuple(global_shape))
    host = _host_part(array, name, box)
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    save = _current_save.get()
    if save is not None:
        save.jax_names.add(name)
    extra = [2] if is_complex else []
    leaf = _tree.Leaf()
    leaf.name = name
    leaf.stored_dtype = stored
    leaf.stored_shape = list(box[1]) + extra
    leaf.array = host
    leaf.address = int(host.__array_interface__["data"][0])
    leaf.nbytes = host.nbytes
    leaf.cuda = None
    leaf.box = (global_shape + extra, list(box[0]) + [0] * len(extra)) if sharded else None
    node: _tree.Node = {"T": name, "k": "jax", "dt": canonical, "sh": global_shape}
    return leaf, node


@contextlib.contextmanager
def saving(state: object, staging: HostStaging,
           later: Gathers | None = None) -> Iterator[set[str]]:
    """Around a save's flatten: every jax.Array's device-to-host copy is started at once
    (``copy_to_host_async``), so the copies overlap one another, and the shards are gathered
    into ``staging``: at once, or with ``later`` (CPU arrays only) by ``later.run()``. Yields
    the set that gets the names of the tensors that jax.Arrays become."""
    from jax import tree_util

    for leaf in tree_util.tree_leaves(state):
        if is_jax_array(leaf) and not on_cpu(leaf):  # on the CPU the host view is the buffer
            leaf.copy_to_host_async()
    save = _Save(staging, later)
    token = _current_save.set(save)
    try:
        yield save.jax_names
    finally:
        _current_save.reset(token)


def all_on_cpu(state: object) -> bool:
    """Whether every jax.Array of ``state`` is on the CPU platform (``on_cpu``)."""
    from jax import tree_util

    return all(on_cpu(leaf) for leaf in tree_util.tree_leaves(state) if is_jax_array(leaf))


def flatten(state: object, staging: HostStaging,
            flatten_plain: Callable[[object], tuple[list[_tree.Leaf], dict[str, str]]],
            defer: bool) -> tuple[list[_tree.Leaf], dict[str, str], Gathers | None]:
    """A save's (leaves, metadata) of a JAX ``state``, and the gathers left for later: with
    ``defer`` and every array on the CPU, the shards are gathered by the returned Gathers and
    NumPy arrays are copied (the caller may change them once the save returns); else None, all
    gathered now. ``flatten_plain`` flattens the state's plain tree (``to_plain``)."""
    later = Gathers() if defer and all_on_cpu(state) else None
    with saving(state, staging, later) as jax_names:
        leaves, metadata = flatten_plain(to_plain(state))
    staging.drop_unused({leaf.name for leaf in leaves})
    if later is not None and not all(leaf.name in jax_names or _own_copy(leaf)
                                     for leaf in leaves):
        later.run()  # a tensor of another library: all is gathered now, as on other platforms
        later = None
    return leaves, metadata, later


def _own_copy(leaf: _tree.Leaf) -> bool:
    """Gives a NumPy leaf a copy of its own; False for a tensor of another library."""
    if not isinstance(leaf.array, np.ndarray):
        return False
    leaf.array = leaf.array.copy()
    leaf.address = int(leaf.array.__array_interface__["data"][0])
    return True


_tree.FOREIGN_LEAVES.append(jax_leaf)
