"""Restore of a JAX pytree onto a target: each process reads the boxes its target shardings ask
for, whatever the sharding the arrays were saved with (asyncckpt.jax's restore)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core, _dtypes, _jax_tree, _stateful, _tree

if TYPE_CHECKING:
    import jax

    Box = tuple[tuple[int, ...], tuple[int, ...]]


def _lookup(root: _tree.Node, components: list[str | int]) -> _tree.Node | None:
    """The saved node at a pytree path, or None where the checkpoint has none."""
    node = root
    for component in components:
        if "d" in node:
            matches = [child for key, child in node["d"]
                       if key == component and type(key) is type(component)]
            if not matches:
                return None
            node = matches[0]
        elif ("l" in node or "t" in node) and type(component) is int:
            items = node.get("l", node.get("t", []))
            if not 0 <= component < len(items):
                return None
            node = items[component]
        else:
            return None
    return node


class _ArrayRead:
    """One target array: the box of it this process addresses, read in one piece when its
    devices' boxes tile one box (the usual layouts), else box by box in rounds; then each
    device's part is put on its device."""

    def __init__(self, position: int, shape: tuple[int, ...], sharding: jax.sharding.Sharding,
                 dtype: np.dtype[Any]) -> None:
        self.position = position
        self.shape = shape
        self.sharding = sharding
        self.device_boxes: dict[Any, Box] = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            if index is None:
                raise ValueError(f"the target sharding {sharding} gives no index for {device}")
            self.device_boxes[device] = _jax_tree.box_of(index, shape)
        unique = set(self.device_boxes.values())
        bounding = _jax_tree.bounding_box(unique, len(shape))
        if _jax_tree.tiles(unique, bounding):
            unique = {bounding}
        self.buffers = {box: np.empty(box[1], dtype=dtype) for box in sorted(unique)}

    def build(self) -> jax.Array:
        import jax

        pieces = [jax.device_put(self._part(box), device)
                  for device, box in self.device_boxes.items()]
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, pieces)

    def _part(self, box: Box) -> np.ndarray[Any, Any]:
        """A device's box, a view of the buffer read for the box that holds it."""
        if box in self.buffers:
            return self.buffers[box]
        # Not a buffer of its own: the buffers are the one bounding box.
        first, extent = box
        (outer_first, _), buffer = next(iter(self.buffers.items()))
        return buffer[tuple(slice(f - o, f - o + e) for f, o, e in zip(first, outer_first, extent))]


def _target_of(leaf: object) -> tuple[tuple[int, ...], np.dtype[Any],
                                      jax.sharding.Sharding] | None:
    """(shape, dtype, sharding) of a target array leaf (a ShapeDtypeStruct or jax.Array)."""
    import jax

    if isinstance(leaf, jax.ShapeDtypeStruct) or _jax_tree.is_jax_array(leaf):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return tuple(int(n) for n in leaf.shape), np.dtype(leaf.dtype), sharding  # type: ignore[attr-defined]
    return None


def restore(reader: _core.Reader, target: object, partial: bool) -> object:
    """The pytree ``target`` with every leaf restored from ``reader`` (see
    asyncckpt.jax.CheckpointManager.restore)."""
    from jax import tree_util

    root = _tree.read_tree(reader.metadata(), reader.path)
    if root is None:
        raise ValueError(f"{reader.path} holds no Python tree (written by the C++ hooks); "
                         "restore it with asyncckpt.CheckpointManager.restore by name")
    flat, treedef = tree_util.tree_flatten_with_path(target)
    out: list[object] = [leaf for _, leaf in flat]
    plan = _tree.Plan()
    arrays: list[_ArrayRead] = []
    reads: list[tuple[_ArrayRead, str, str, list[int]]] = []
    stateful: list[tuple[int, _stateful.Stateful, Any]] = []
    missing: list[str] = []
    for position, (path, leaf) in enumerate(flat):
        components = [_jax_tree.key_component(key) for key in path]
        names = [_tree.escape(c) if isinstance(c, str) else str(c) for c in components]
        where = tree_util.keystr(path) or "the root"
        node = _lookup(root, components)
        if node is None:
            missing.append(where)
            continue
        wanted = _target_of(leaf)
        if wanted is not None:
            shape, dtype, sharding = wanted
            if "T" not in node and "A" not in node:
                raise ValueError(f"cannot restore {where}: the checkpoint holds "
                                 f"{_tree.describe_node(node)}, the target an array")
            canonical = _tree.node_canonical(node)
            if canonical != dtype.name or list(node["sh"]) != list(shape):
                raise ValueError(f"cannot restore {where}: the checkpoint holds "
                                 f"{_tree.describe_node(node)}, the target an array of shape "
                                 f"{shape} and dtype {dtype.name}")
            _dtypes.stored_form(canonical, f"array at {where}")
            array_read = _ArrayRead(position, shape, sharding, dtype)
            arrays.append(array_read)
            name = node["T"] if "T" in node else node["A"]
            reads.append((array_read, name, canonical, list(node["sh"])))
        elif _stateful.is_stateful(leaf):
            state_dict = _stateful.state_dict_of(leaf)
            plan.whole.add(id(state_dict))
            stateful.append((position, leaf, _tree.fill(state_dict, node, names, plan)))
        elif isinstance(leaf, np.ndarray):
            out[position] = _tree.fill(np.empty(leaf.shape, leaf.dtype.newbyteorder("=")),
                                       node, names, plan)
        else:
            out[position] = _tree.build(node, names, plan)
    if missing and not partial:
        raise ValueError(f"cannot restore: {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} in the target but not in the "
                         f"checkpoint {reader.path}; pass partial=True to leave "
                         f"{'it' if len(missing) == 1 else 'them'} as given")
    _read(reader, plan, reads)
    plan.finish()
    for array_read in arrays:
        out[array_read.position] = array_read.build()
    for position, obj, state_dict in stateful:
        obj.load_state_dict(state_dict)
        out[position] = obj
    return tree_util.tree_unflatten(treedef, out)


def _read(reader: _core.Reader, plan: _tree.Plan,
          reads: list[tuple[_ArrayRead, str, str, list[int]]]) -> None:
    """Runs ``plan``'s reads and every array's boxes, one C++ call per round (a tensor's boxes
    are read one per round: a call takes one box of each tensor)."""
    rounds = max([len(array_read.buffers) for array_read, *_ in reads] + [1])
    for number in range(rounds):
        this_round = plan if number == 0 else _tree.Plan()
        for array_read, name, canonical, shape in reads:
            boxes = list(array_read.buffers.items())
            if number >= len(boxes):
                continue
            (first, extent), buffer = boxes[number]
            extra = [2] if _dtypes.STORED[canonical][1] else []
            box = None
            if list(extent) != shape:
                box = (shape + extra, list(first) + [0] * len(extra))
            this_round.read(name, canonical, shape + extra, buffer,
                            int(buffer.__array_interface__["data"][0]), None, box)
        reader.read_into(this_round.specs, this_round.boxes)
