"""Restore of a JAX pytree onto a target: each process reads the boxes its target shardings ask
for, whatever the sharding the arrays were saved with (asyncckpt.jax's restore).

On the CPU platform the bytes read become the arrays' device buffers: the reads go into host
memory aligned as JAX's CPU client wants it, which ``device_put(..., may_alias=True)`` then
takes in place, so a restore holds each byte once. Boxes that are not contiguous in what was
read (column blocks) are made so by rearranging it in place, through one scratch buffer, or
else (other layouts) copied out. Devices that hold the same box (replicas) share
its memory: JAX takes such memory as immutable, and a donated step computes into new memory
instead of writing into it (tests/python/test_jax.py), so no device sees another's writes.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core, _dtypes, _jax_tree, _prefault, _stateful, _tree

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
        self.on_cpu = all(getattr(device, "platform", None) == "cpu"  # absent from the stubs
                          for device in self.device_boxes)
        self.buffers = {box: _aligned_empty(box[1], dtype) for box in sorted(unique)}
        # On the CPU, the memory each box's devices take: a view of what is read, or for boxes
        # that are not contiguous there (column blocks), what is read rearranged in place so
        # that they are (``bands``), or else copies made once read.
        self.hosts: dict[Box, np.ndarray[Any, Any]] = {}
        self.copies: list[Box] = []
        for box in self.device_boxes.values() if self.on_cpu else ():
            if box not in self.hosts:
                part = self._part(box)
                self.hosts[box] = part
                if not part.flags.c_contiguous:
                    self.copies.append(box)
        self.bands = _column_bands(self.copies, next(iter(self.buffers))) if self.copies else None
        if self.bands is None:
            for box in self.copies:
                self.hosts[box] = _aligned_empty(box[1], dtype)
        self.scratch = np.empty(0, np.uint8)  # at least scratch_bytes() for the bands

    def build(self) -> jax.Array:
        """The array, once read."""
        import jax

        if not self.on_cpu:
            pieces = [jax.device_put(self._part(box), device)
                      for device, box in self.device_boxes.items()]
        else:
            if self.bands is not None:
                self._rearrange()
            else:
                for box in self.copies:
                    np.copyto(self.hosts[box], self._part(box))
            pieces = [jax.device_put(self.hosts[box], device, may_alias=True)
                      for device, box in self.device_boxes.items()]
        self.buffers, self.hosts = {}, {}  # the arrays hold what they use of them
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, pieces)

    def copy_memory(self) -> list[tuple[int, int]]:
        """(address, bytes) of the copies ``build`` makes: new memory, faulted in ahead."""
        if self.bands is not None:
            return []
        return [(int(self.hosts[box].__array_interface__["data"][0]), self.hosts[box].nbytes)
                for box in self.copies]

    def scratch_bytes(self) -> int:
        """The scratch memory ``build`` needs to rearrange the bands: all but a band's first
        column block, for the largest band."""
        itemsize = next(iter(self.buffers.values())).itemsize
        return max([itemsize * sum(math.prod(box[1]) for box in blocks[1:])
                    for _, blocks in self.bands or []], default=0)

    def _rearrange(self) -> None:
        """Puts each band's column blocks one after the other, in place (``bands``)."""
        assert self.bands is not None
        (outer_first, _), buffer = next(iter(self.buffers.items()))
        for row, blocks in self.bands:
            height = blocks[0][1][0]
            band = buffer[row - outer_first[0]:row - outer_first[0] + height]
            widths = [box[1][1] for box in blocks]
            for box, block in zip(blocks, _columns_in_turn(band, widths, self.scratch)):
                self.hosts[box] = block

    def _part(self, box: Box) -> np.ndarray[Any, Any]:
        """A device's box, a view of the buffer read for the box that holds it."""
        if box in self.buffers:
            return self.buffers[box]
        # Not a buffer of its own: the buffers are the one bounding box.
        first, extent = box
        (outer_first, _), buffer = next(iter(self.buffers.items()))
        return buffer[tuple(slice(f - o, f - o + e) for f, o, e in zip(first, outer_first, extent))]


def _column_bands(boxes: list[Box], outer: Box) -> list[tuple[int, list[Box]]] | None:
    """``boxes`` (which tile ``outer``) as bands of rows, each cut into column blocks, when
    they are such a grid and every other dimension is whole: (first row, blocks in column
    order) per band. None for any other layout."""
    first, extent = outer
    if len(extent) < 2 or any(box[1][2:] != extent[2:] for box in boxes):
        return None
    bands: dict[tuple[int, int], list[Box]] = {}
    for box in boxes:
        bands.setdefault((box[0][0], box[1][0]), []).append(box)
    rows = sorted(bands)
    if any(start + height > next_start for (start, height), (next_start, _)
           in itertools.pairwise(rows)):
        return None  # bands that overlap: not a grid
    out = []
    for start, height in rows:
        blocks = sorted(bands[(start, height)], key=lambda box: box[0][1])
        column = first[1]
        for box in blocks:
            if box[0][1] != column:
                return None
            column += box[1][1]
        if column != first[1] + extent[1]:
            return None
        out.append((start, blocks))
    return out


def _columns_in_turn(band: np.ndarray[Any, Any], widths: list[int],
                     scratch: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    """Rearranges ``band`` (rows x columns x ..., C-order, contiguous) in place so that its
    column blocks of ``widths`` lie one after the other, each in C order, and returns them
    (views of its memory). ``scratch``: bytes for all blocks but the first."""
    height, columns = band.shape[:2]
    row = band.reshape(height, -1)  # one row of the band per line
    cell = row.shape[1] // columns  # elements per (row, column)
    flat = band.reshape(-1)
    first = widths[0] * cell  # elements of a row of the first block
    rest = scratch[:(row.shape[1] - first) * height * band.itemsize].view(band.dtype)
    # 1. The other blocks go to scratch, one after the other.
    done, column = 0, widths[0]
    for width in widths[1:]:
        size = height * width * cell
        rest[done:done + size].reshape(height, width * cell)[...] = (
            row[:, column * cell:(column + width) * cell])
        done, column = done + size, column + width
    # 2. The first block's rows move to the front, in runs of rows whose sources all lie past
    # their destinations (row i moves from i * columns to i * widths[0]), so nothing is read
    # after it was overwritten; row 0 is in place.
    start = 1
    while start < height:
        end = max(start + 1, min(height, start * row.shape[1] // first))
        np.copyto(flat[start * first:end * first].reshape(end - start, first),
                  row[start:end, :first])
        start = end
    # 3. The other blocks follow it.
    flat[height * first:] = rest
    out, offset = [], 0
    for width in widths:
        size = height * width * cell
        out.append(flat[offset:offset + size].reshape((height, width) + band.shape[2:]))
        offset += size
    return out


# Where the host memory of a restored array starts: JAX's CPU client takes memory aligned so
# (64 bytes would do) in place, and it is the page size, which O_DIRECT asks for.
_ALIGNMENT = 4096


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A new array of ``shape`` whose memory starts on an _ALIGNMENT boundary."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    start = -int(raw.__array_interface__["data"][0]) % _ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


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
    # One scratch buffer for every array whose column blocks are rearranged (one at a time).
    scratch = _aligned_empty((max([array_read.scratch_bytes() for array_read, *_ in reads],
                                  default=0),), np.dtype(np.uint8))
    for array_read, *_ in reads:
        array_read.scratch = scratch
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
        # Every destination is new memory: its page faults are taken ahead of the reads, and
        # those of the copies made once all is read beside the last reads.
        then = ([piece for array_read, *_ in reads for piece in array_read.copy_memory()]
                + [(int(scratch.__array_interface__["data"][0]), scratch.nbytes)]
                if number == rounds - 1 else [])
        _prefault.read_into_new_memory(reader, this_round.specs, this_round.boxes, then)
