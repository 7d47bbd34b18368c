"""Nested state <-> named tensors plus a JSON description of everything else.

A state is a dict (str or int keys), list or tuple, nested, whose leaves are torch tensors, NumPy
arrays, or plain values (None, bool, int, float, complex, str, bytes, NumPy scalars). Each tensor
becomes one named tensor of the checkpoint, its name the path of keys joined with "/", each key
escaped as in a JSON pointer ("~" -> "~0", "/" -> "~1", an empty key -> "~e"), so that names
are unambiguous. The tree itself (container types, key types, every plain value bit for bit, and
which tensor sits where with its torch or NumPy dtype) is JSON in the checkpoint's metadata, under
the keys "asyncckpt.python.tree.NNNNN" (split into pieces the format accepts).

No tensor bytes pass through Python: a leaf carries the address of its memory, which the C++
engine copies from (save) or reads into (restore, load).
"""

from __future__ import annotations

import base64
import collections
import json
import struct
import sys
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np

from . import _dtypes, _pickled, _shared

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeAlias, TypeGuard

    import numpy.typing as npt
    import torch

    from . import _core

    # A tensor of the state: a NumPy array or a torch tensor (torch is optional at run time).
    Array: TypeAlias = npt.NDArray[Any] | torch.Tensor
    # A dict key a state may hold.
    DictKey: TypeAlias = str | int


class Node(TypedDict, total=False):
    """One position of the tree, a JSON object: its keys say what it holds."""

    # A tensor: its name in the checkpoint, "torch" or "numpy", its dtype (the canonical name,
    # or NumPy's dtype.str with the byte order), its shape.
    T: str
    k: str
    dt: str
    sh: list[int]
    A: str  # a tensor that is the memory of an earlier one, named here (tied weights)
    d: list[tuple[DictKey, Node]]  # a dict's (key, node) pairs in order (lists once read back)
    o: int  # 1: the dict is an OrderedDict
    m: Node  # the OrderedDict's _metadata
    l: list[Node]  # a list
    t: list[Node]  # a tuple
    n: int  # None
    b: bool
    i: int
    f: str  # a float's 8 little-endian bytes in hex
    c: list[str]  # a complex: its real and imaginary parts, each as "f" holds a float
    s: str
    y: str  # bytes in base64
    ns: str  # a NumPy scalar: its dtype.str,
    v: str  # and its bytes in hex
    p: str  # a pickle in base64 (only with allow_pickle=True)


class Container(Protocol):
    """A dict or list of the state, updated in place once every read succeeded."""

    def __setitem__(self, key: Any, value: Any, /) -> None:
        """container[key] = value."""

TREE_KEY_PREFIX = "asyncckpt.python.tree."
FORMAT_KEY = "asyncckpt.python.format"
FORMAT_VERSION = "1"
_PIECE_CHARS = 512 * 1024  # well under the format's 1 MiB per metadata value


def escape(key: str) -> str:
    """The tensor-name component of one key."""
    if key == "":
        return "~e"
    return key.replace("~", "~0").replace("/", "~1")


def _where(names: list[str]) -> str:
    return "'" + "/".join(names) + "'" if names else "the state's root"


def is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    """True for a torch tensor; never imports torch (a program without it holds no tensor)."""
    torch_module = sys.modules.get("torch")
    return torch_module is not None and isinstance(value, torch_module.Tensor)


def is_array(value: object) -> TypeGuard[Array]:
    """True for a NumPy array or a torch tensor."""
    return isinstance(value, np.ndarray) or is_tensor(value)


def copy_versions(source: object, destination: object) -> None:
    """Gives ``destination`` the ``_metadata`` of ``source`` when it has one: the modules'
    versions that torch keeps on a state dict's OrderedDict, which load_state_dict reads."""
    versions = getattr(source, "_metadata", None)
    if versions is not None:
        set_versions(destination, versions)


def set_versions(container: object, versions: object) -> None:
    """``container._metadata = versions``, an attribute no dict type declares."""
    setattr(container, "_metadata", versions)  # noqa: B010 - mypy refuses the plain assignment


def _contains_array(value: object) -> bool:
    if is_array(value):
        return True
    if isinstance(value, dict):
        return any(_contains_array(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_array(v) for v in value)
    return False


class Leaf:
    """One tensor to save: its name, stored dtype and shape, and memory (kept alive here)."""

    __slots__ = ("address", "array", "box", "cuda", "name", "nbytes", "stored_dtype",
                 "stored_shape")

    name: str
    stored_dtype: str  # the C++ dtype short name
    stored_shape: list[int]
    array: Array  # the memory the engine copies from
    address: int
    nbytes: int
    cuda: int | None  # the GPU that holds it, None on the host
    # A shard of a global tensor (a DTensor's local part): (global stored shape, its first
    # index in each global dimension); None for a whole tensor.
    box: tuple[list[int], list[int]] | None

    def spec(self) -> _core.TensorSpec:
        """The tensor as the C++ module takes it."""
        return (self.name, self.stored_dtype, self.stored_shape, self.address, self.nbytes,
                self.cuda)


def _cuda_ordinal(tensor: torch.Tensor, where: str) -> int | None:
    import torch  # a tensor is in hand, so torch is loaded

    kind = tensor.device.type
    if kind == "cpu":
        return None
    if kind == "cuda":
        index = tensor.device.index
        return index if index is not None else torch.cuda.current_device()
    raise TypeError(f"tensor at {where} is on {tensor.device}; asyncckpt reads host and CUDA "
                    "memory only: move it to the CPU first")


def dtensor_box(tensor: torch.Tensor, where: str) -> tuple[torch.Tensor, list[int],
                                                          list[int]] | None:
    """For a DTensor sharded over its mesh: (its local part, the global shape, the local part's
    first index in each global dimension); None for any other tensor and for a DTensor every
    rank holds whole (a replica). ValueError for a DTensor with pending partial sums."""
    import torch.distributed.tensor as dtensor

    if not isinstance(tensor, dtensor.DTensor):
        return None
    placements = tensor.placements
    if any(p.is_partial() for p in placements):
        raise ValueError(f"tensor at {where} is a DTensor with a Partial placement (a sum not "
                         "taken yet): save tensor.redistribute(...) or full_tensor()")
    if all(p.is_replicate() for p in placements):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                      placements)
    return tensor.to_local(), list(tensor.shape), [int(o) for o in offset]


def _torch_leaf(tensor: torch.Tensor, names: list[str]) -> tuple[Leaf, Node]:
    import torch  # a tensor is in hand, so torch is loaded

    where = _where(names)
    global_shape: list[int] | None = None
    shard = dtensor_box(tensor, where) if type(tensor) is not torch.Tensor else None
    if shard is not None:
        tensor, global_shape, offset = shard
    elif type(tensor) is not torch.Tensor:
        import torch.distributed.tensor as dtensor

        if isinstance(tensor, dtensor.DTensor):
            tensor = tensor.to_local()  # a replicated DTensor: every rank holds it whole
    if tensor.layout != torch.strided:
        raise TypeError(f"tensor at {where} has layout {tensor.layout}; asyncckpt stores dense "
                        "tensors only: save tensor.to_dense()")
    if tensor.is_quantized:
        raise TypeError(f"tensor at {where} is quantized ({tensor.dtype}), which asyncckpt "
                        "cannot store exactly: save its int_repr() and quantization parameters")
    canonical = _dtypes.torch_dtype_name(tensor.dtype)
    stored, is_complex = _dtypes.stored_form(canonical, f"tensor at {where}")
    leaf = Leaf()
    leaf.cuda = _cuda_ordinal(tensor, where)
    tensor = tensor.detach()
    # Lazy conjugation and negation are flags on a view: the memory holds the unresolved values.
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    # A non-contiguous tensor is copied contiguous here (one extra copy, on this thread).
    tensor = tensor.contiguous()
    shape = list(tensor.shape)
    leaf.name = "/".join(names)
    leaf.stored_dtype = stored
    leaf.stored_shape = shape + [2] if is_complex else shape
    leaf.array = tensor
    leaf.address = tensor.data_ptr()
    leaf.nbytes = tensor.numel() * tensor.element_size()
    leaf.box = None
    if global_shape is not None:
        extra = [2] if is_complex else []
        leaf.box = (global_shape + extra, offset + [0] * len(extra))
        shape = global_shape  # the tree describes the global tensor
    node: Node = {"T": leaf.name, "k": "torch", "dt": canonical, "sh": shape}
    return leaf, node


def torch_leaf(tensor: torch.Tensor, name: str) -> Leaf:
    """The leaf of a whole torch tensor stored under ``name`` (DCP's items)."""
    leaf, _ = _torch_leaf(tensor, [name])
    return leaf


def _numpy_leaf(array: npt.NDArray[Any], names: list[str]) -> tuple[Leaf, Node]:
    where = _where(names)
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(f"array at {where} is a masked array; save its data and mask as two "
                        "arrays")
    if array.dtype.kind not in "biufc" or array.dtype.fields is not None:
        raise TypeError(f"array at {where} has dtype {array.dtype}, which asyncckpt cannot "
                        "store: only numeric and bool arrays")
    canonical = _dtypes.numpy_dtype_name(array.dtype)
    stored, is_complex = _dtypes.stored_form(canonical, f"array at {where}")
    original_dtype = array.dtype.str
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # one extra copy, on this thread
    shape = list(array.shape)
    leaf = Leaf()
    leaf.name = "/".join(names)
    leaf.stored_dtype = stored
    leaf.stored_shape = shape + [2] if is_complex else shape
    leaf.array = array
    leaf.address = _address(array)
    leaf.nbytes = array.nbytes
    leaf.cuda = None
    leaf.box = None
    node: Node = {"T": leaf.name, "k": "numpy", "dt": original_dtype, "sh": shape}
    return leaf, node


def _pack_double(value: float) -> str:
    return struct.pack("<d", value).hex()


def _unpack_double(text: str) -> float:
    value: float = struct.unpack("<d", bytes.fromhex(text))[0]
    return value


def encode_value(value: object, where: str) -> Node:
    """The JSON node of a plain value, exact in type and value; TypeError for anything else."""
    # Exact types: a subclass (an IntEnum, a str subclass) would not come back as itself.
    kind = type(value)
    if value is None:
        return {"n": 0}
    if type(value) is bool:
        return {"b": value}
    if type(value) is int:
        return {"i": value}
    if type(value) is float:
        return {"f": _pack_double(value)}  # every bit, NaN payloads and -0.0 included
    if type(value) is complex:
        return {"c": [_pack_double(value.real), _pack_double(value.imag)]}
    if type(value) is str:
        return {"s": value}
    if type(value) is bytes:
        return {"y": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return {"ns": value.dtype.str, "v": value.tobytes().hex()}
    pickled = _pickled.encode(value, where)  # only with allow_pickle=True
    if pickled is not None:
        return pickled
    raise TypeError(f"the value at {where} is a {kind.__module__}.{kind.__qualname__}, which "
                    "asyncckpt cannot store: use tensors, arrays, dicts, lists, tuples, None, "
                    "bool, int, float, complex, str, bytes or NumPy scalars (or pass "
                    "allow_pickle=True)")


def decode_value(node: Node, where: str = "a value") -> object:
    """The plain value of a value node (a pickled one only where pickles are allowed)."""
    if "n" in node:
        return None
    if "b" in node:
        return bool(node["b"])
    if "i" in node:
        return int(node["i"])
    if "f" in node:
        return _unpack_double(node["f"])
    if "c" in node:
        return complex(_unpack_double(node["c"][0]), _unpack_double(node["c"][1]))
    if "s" in node:
        return node["s"]
    if "y" in node:
        return base64.b64decode(node["y"])
    if "ns" in node:
        return np.frombuffer(bytes.fromhex(node["v"]), dtype=np.dtype(node["ns"]))[0]
    if "p" in node:
        return _pickled.decode(node, where)
    raise ValueError(f"unknown node in the checkpoint's Python tree: {sorted(node)}")


def _dict_key_component(key: object, names: list[str]) -> str:
    if type(key) is str:
        return escape(key)
    if type(key) is int:
        return str(key)
    raise TypeError(f"the dict at {_where(names)} has a key {key!r} of type "
                    f"{type(key).__name__}; asyncckpt stores str and int keys only")


# Arrays of other libraries (asyncckpt.jax registers jax.Array's): each maker returns the leaf
# and tree node of a value it knows, None for any other. Registered by the module that knows
# the library, so this one imports none.
FOREIGN_LEAVES: list[Callable[[object, list[str]], tuple[Leaf, Node] | None]] = []

MAX_DEPTH = 100  # containers nested deeper than this are refused (Python's stack is finite)


def enter_container(value: object, names: list[str], active: set[int]) -> None:
    """Checks that a container may be descended into: not deeper than MAX_DEPTH, not a cycle."""
    if len(names) >= MAX_DEPTH:
        raise ValueError(f"the state nests containers deeper than {MAX_DEPTH} levels at "
                         f"{_where(names[:3] + ['...'])}; asyncckpt stores at most {MAX_DEPTH}")
    if id(value) in active:
        raise ValueError(f"the state refers to itself: the {type(value).__name__} at "
                         f"{_where(names)} contains itself (a state with a cycle can be neither saved nor restored)")
    active.add(id(value))


def _flatten(value: object, names: list[str], leaves: list[Leaf], allow_arrays: bool = True,
             active: set[int] | None = None) -> Node:
    active = set() if active is None else active
    if isinstance(value, (dict, list, tuple)):
        enter_container(value, names, active)
        try:
            return _flatten_container(value, names, leaves, allow_arrays, active)
        finally:
            active.discard(id(value))
    if is_array(value):
        if not allow_arrays:
            raise TypeError(f"a tensor at {_where(names)} where only plain values may be")
        leaf, node = (_numpy_leaf(value, names) if isinstance(value, np.ndarray)
                      else _torch_leaf(value, names))
        leaves.append(leaf)
        return node
    for make_leaf in FOREIGN_LEAVES:
        made = make_leaf(value, names) if allow_arrays else None
        if made is not None:
            leaves.append(made[0])
            return made[1]
    return encode_value(value, _where(names))


def _flatten_container(value: dict[Any, Any] | list[Any] | tuple[Any, ...], names: list[str],
                       leaves: list[Leaf], allow_arrays: bool, active: set[int]) -> Node:
    if isinstance(value, dict):
        entries: list[tuple[DictKey, Node]] = []
        components: dict[str, DictKey] = {}
        for key, child in value.items():
            component = _dict_key_component(key, names)
            if component in components:
                raise ValueError(f"the keys {components[component]!r} and {key!r} of the dict at "
                                 f"{_where(names)} would both be named '{component}'")
            components[component] = key
            entries.append((key, _flatten(child, names + [component], leaves, allow_arrays,
                                          active)))
        node: Node = {"d": entries}
        if type(value) is collections.OrderedDict:
            node["o"] = 1
            # model.state_dict() carries the modules' versions here; load_state_dict reads them.
            versions = getattr(value, "_metadata", None)
            if versions is not None:
                node["m"] = _flatten(versions, names + ["_metadata"], leaves, False, active)
        return node
    if type(value) in (list, tuple):
        items = [_flatten(child, names + [str(i)], leaves, allow_arrays, active)
                 for i, child in enumerate(value)]
        return {"l": items} if type(value) is list else {"t": items}
    return encode_value(value, _where(names))


def flatten(state: object) -> tuple[list[Leaf], dict[str, str]]:
    """(leaves, metadata) of a state whose root is a dict, list or tuple."""
    if not isinstance(state, (dict, list, tuple)):
        raise TypeError(f"a state is a dict, list or tuple of tensors and values, not a "
                        f"{type(state).__name__}")
    leaves: list[Leaf] = []
    root = _flatten(state, [], leaves)
    leaves = _shared.dedupe(leaves, root)  # tied tensors are stored once
    text = json.dumps({"root": root}, separators=(",", ":"), allow_nan=False)
    metadata = {FORMAT_KEY: FORMAT_VERSION}
    for index, start in enumerate(range(0, max(len(text), 1), _PIECE_CHARS)):
        metadata[f"{TREE_KEY_PREFIX}{index:05d}"] = text[start:start + _PIECE_CHARS]
    return leaves, metadata


def read_tree(user_metadata: Mapping[str, str], path: str) -> Node | None:
    """The root node stored in a checkpoint's metadata, or None for a checkpoint without one."""
    if FORMAT_KEY not in user_metadata:
        return None
    if user_metadata[FORMAT_KEY] != FORMAT_VERSION:
        raise ValueError(f"{path}: Python tree format {user_metadata[FORMAT_KEY]!r}; this "
                         f"asyncckpt reads format {FORMAT_VERSION}")
    pieces = sorted(k for k in user_metadata if k.startswith(TREE_KEY_PREFIX))
    try:
        root: Node = json.loads("".join(user_metadata[k] for k in pieces))["root"]
    except (ValueError, KeyError, RecursionError) as error:
        raise ValueError(f"{path}: the Python tree in the metadata is damaged: {error}") from None
    return root


# ---- building and filling ------------------------------------------------------------------

def node_canonical(node: Node) -> str:
    """The canonical dtype name of a tensor node."""
    # "numpy" keeps dtype.str (with its byte order); "torch" and "jax" the canonical name.
    return np.dtype(node["dt"]).name if node["k"] == "numpy" else node["dt"]


def _stored_shape(node: Node, canonical: str) -> list[int]:
    _, is_complex = _dtypes.STORED[canonical]
    return list(node["sh"]) + [2] if is_complex else list(node["sh"])


class Plan:
    """Reads to run in one C++ call, then what to do once they succeeded."""

    def __init__(self) -> None:
        self.specs: list[_core.TensorSpec] = []
        self.keep: list[Array] = []  # arrays read into, alive until the reads are done
        self.copies: list[tuple[Array, Array]] = []  # (destination, temporary of its kind)
        self.assigns: list[tuple[Container, object, object]] = []  # (container, key, value)
        self.built: dict[str, Array] = {}  # tensor name -> what it went into (for tied ones)
        # Dicts that take every key of the checkpoint: the state dicts made for stateful
        # objects (their load_state_dict needs it all: a fresh optimizer's empty "state").
        self.whole: set[int] = set()
        self.missing: list[str] = []  # template positions the checkpoint lacks
        self.boxes: dict[str, tuple[list[int], list[int]]] = {}  # shards read: name -> box
        # Where new torch tensors go (load's map_location, checked): None for the CPU.
        self.device: torch.device | None = None

    def read(self, name: str, canonical: str, node_shape: list[int], array: Array, address: int,
             cuda: int | None, box: tuple[list[int], list[int]] | None = None) -> None:
        """Reads tensor ``name`` into ``array``'s memory at ``address``: the whole tensor, or
        with ``box`` (global stored shape, first index) that box of it."""
        stored, _ = _dtypes.STORED[canonical]
        if box is not None:
            self.boxes[name] = box
            node_shape = list(array.shape) + node_shape[len(array.shape):]
        nbytes = array.nbytes if isinstance(array, np.ndarray) else (
            array.numel() * array.element_size())
        self.specs.append((name, stored, node_shape, address, nbytes, cuda))
        self.keep.append(array)

    def finish(self) -> None:
        """After the reads: the copies into their destinations, then the assignments."""
        for destination, temporary in self.copies:
            _copy(destination, temporary)
        for container, key, value in self.assigns:
            container[key] = value


def _copy(destination: Array, source: Array) -> None:
    """Copies ``source`` into ``destination``, an array or tensor of the same kind."""
    if isinstance(destination, np.ndarray):
        np.copyto(destination, source)
        return
    import torch  # a tensor is in hand, so torch is loaded

    with torch.no_grad():
        destination.copy_(torch.as_tensor(source))


def new_array(node: Node, where: str, device: torch.device | None = None) -> Array:
    """An empty tensor or array for a tensor node: a torch tensor on ``device`` (the CPU when
    None), a NumPy array in host memory."""
    canonical = node_canonical(node)
    if node["k"] == "torch":
        import torch  # a torch tensor is rebuilt as one, whether the program imported torch or not

        dtype = _dtypes.torch_dtype(canonical)
        if dtype is None:
            raise TypeError(f"tensor at {where} has dtype {canonical}, which this torch "
                            f"({torch.__version__}) lacks")
        return torch.empty(node["sh"], dtype=dtype, device=device)
    if node["k"] == "jax":  # comes back as NumPy (ml_dtypes' for bfloat16 and float8)
        return np.empty(node["sh"], dtype=_dtypes.numpy_or_ml_dtype(canonical))
    return np.empty(node["sh"], dtype=np.dtype(node["dt"]).newbyteorder("="))


def _address(array: Array) -> int:
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return array.data_ptr()


def build(node: Node, names: list[str], plan: Plan) -> object:
    """A new object for `node`; its tensors are read by the plan."""
    if "T" in node:
        where = _where(names)
        array = new_array(node, where, plan.device)
        canonical = node_canonical(node)
        cuda = None if isinstance(array, np.ndarray) else _cuda_ordinal(array, where)
        plan.read(node["T"], canonical, _stored_shape(node, canonical), array, _address(array),
                  cuda)
        # A NumPy node's dtype is NumPy's dtype.str, which carries the byte order.
        if isinstance(array, np.ndarray) and not np.dtype(node["dt"]).isnative:
            # Read in native order; handed back in the byte order it was saved with.
            swapped = array.astype(np.dtype(node["dt"]))
            plan.keep.append(array)
            plan.copies.append((swapped, array))
            array = swapped
        plan.built[node["T"]] = array
        return array
    if _shared.is_alias(node):
        return _shared.build_alias(node, plan, _where(names))
    if "d" in node:
        out: dict[DictKey, object] = collections.OrderedDict() if node.get("o") else {}
        for key, child in node["d"]:
            out[key] = build(child, names + [_key_name(key)], plan)
        if "m" in node:
            set_versions(out, build(node["m"], names + ["_metadata"], plan))
        return out
    if "l" in node:
        return [build(child, names + [str(i)], plan) for i, child in enumerate(node["l"])]
    if "t" in node:
        return tuple(build(child, names + [str(i)], plan) for i, child in enumerate(node["t"]))
    return decode_value(node, _where(names))


def _key_name(key: DictKey) -> str:
    return escape(key) if isinstance(key, str) else str(key)


def _describe(value: object) -> str:
    if is_tensor(value):
        return f"a torch tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"a NumPy array of shape {value.shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def describe_node(node: Node) -> str:
    """What a node holds, in words, for an error message."""
    if "T" in node or "A" in node:
        return f"a tensor of shape {tuple(node['sh'])} and dtype {node_canonical(node)}"
    for key, what in (("d", "dict"), ("l", "list"), ("t", "tuple"), ("p", "pickled value")):
        if key in node:
            return f"a {what}"
    return f"a {type(decode_value(node)).__name__}"


def fill_tensor(template: Array, node: Node, names: list[str], plan: Plan) -> None:
    """Plans the read of a tensor node into ``template`` (dtype and shape must match)."""
    where = _where(names)
    canonical = node_canonical(node)
    if isinstance(template, np.ndarray):
        have = _dtypes.numpy_dtype_name(template.dtype)
    else:
        have = _dtypes.torch_dtype_name(template.dtype)
    if have != canonical or list(template.shape) != list(node["sh"]):
        raise ValueError(f"cannot restore {where}: the checkpoint holds {describe_node(node)}, "
                         f"the given state {_describe(template)}")
    stored_shape = _stored_shape(node, canonical)
    plan.built[node["T"]] = template
    if isinstance(template, np.ndarray):
        if not template.flags.writeable:
            raise ValueError(f"cannot restore {where}: the given array is read-only")
        if template.flags.c_contiguous and template.dtype.isnative:
            plan.read(node["T"], canonical, stored_shape, template, _address(template), None)
        else:
            temporary = np.empty(template.shape, dtype=template.dtype.newbyteorder("="))
            plan.read(node["T"], canonical, stored_shape, temporary, _address(temporary), None)
            plan.copies.append((template, temporary))
        return
    import torch  # a tensor is in hand, so torch is loaded

    box = None
    if type(template) is not torch.Tensor:
        shard = dtensor_box(template, where)
        if shard is not None:  # this rank reads its own shard of the global tensor
            template, global_shape, offset = shard
            extra = [2] if _dtypes.STORED[canonical][1] else []
            box = (global_shape + extra, offset + [0] * len(extra))
        else:
            import torch.distributed.tensor as dtensor

            if isinstance(template, dtensor.DTensor):
                template = template.to_local()  # a replica: read whole
    cuda = _cuda_ordinal(template, where)
    if template.is_contiguous() and not template.is_conj() and not template.is_neg():
        plan.read(node["T"], canonical, stored_shape, template, template.data_ptr(), cuda, box)
    else:
        contiguous = torch.empty(template.shape, dtype=template.dtype, device=template.device)
        plan.read(node["T"], canonical, stored_shape, contiguous, contiguous.data_ptr(), cuda, box)
        plan.copies.append((template, contiguous))


def fill(template: object, node: Node, names: list[str], plan: Plan) -> object:
    """The value at this position after the restore: `template` filled in place, or a new one.

    Tensors and arrays are filled in place (dtype and shape must match); dicts and lists are
    updated in place; tuples and plain values are replaced. A position that holds None in the
    template takes whatever the checkpoint has.
    """
    where = _where(names)
    if template is None:
        return build(node, names, plan)
    if "T" in node or _shared.is_alias(node):
        if not is_array(template):
            raise ValueError(f"cannot restore {where}: the checkpoint holds "
                             f"{describe_node(node)}, the given state {_describe(template)}")
        if _shared.is_alias(node):
            _shared.fill_alias(template, node, plan, where)
        else:
            fill_tensor(template, node, names, plan)
        return template
    if is_array(template):
        raise ValueError(f"cannot restore {where}: the checkpoint holds {describe_node(node)}, "
                         f"the given state {_describe(template)}")
    if "d" in node:
        if not isinstance(template, dict):
            return _replace(template, node, names, plan)
        _fill_dict(template, node, names, plan)
        if "m" in node and type(template) is collections.OrderedDict:
            set_versions(template, build(node["m"], names + ["_metadata"], plan))
        return template
    if "l" in node:
        if not isinstance(template, list):
            return _replace(template, node, names, plan)
        if len(template) == len(node["l"]):
            for i, child in enumerate(node["l"]):
                value = fill(template[i], child, names + [str(i)], plan)
                if value is not template[i]:
                    plan.assigns.append((template, i, value))
            return template
        if _contains_array(template):
            raise ValueError(f"cannot restore {where}: the checkpoint's list has "
                             f"{len(node['l'])} items, the given one {len(template)}")
        plan.assigns.append((template, slice(None), build(node, names, plan)))
        return template
    if "t" in node:
        if type(template) is not tuple or len(template) != len(node["t"]):
            return _replace(template, node, names, plan)
        return tuple(fill(item, child, names + [str(i)], plan)
                     for i, (item, child) in enumerate(zip(template, node["t"])))
    return _replace(template, node, names, plan)


def _fill_dict(template: dict[Any, Any], node: Node, names: list[str], plan: Plan) -> None:
    """Fills the keys of ``template`` that the checkpoint has; reads nothing else.

    A key of ``template`` the checkpoint lacks goes to ``plan.missing``. A key of the checkpoint
    that ``template`` lacks is left alone (not read, not added), unless ``template`` is empty
    (a placeholder, as None is: it takes the whole saved dict) or a stateful object's own state
    dict (``plan.whole``), whose ``load_state_dict`` gets everything that was saved.
    """
    saved = dict(node["d"])
    for key in template:
        if key not in saved:
            plan.missing.append(_where(names + [_key_name(key)]))
    take_all = not template or id(template) in plan.whole
    for key, child in node["d"]:
        child_names = names + [_key_name(key)]
        if key in template:
            value = fill(template[key], child, child_names, plan)
            if value is not template[key]:
                plan.assigns.append((template, key, value))
        elif take_all:
            plan.assigns.append((template, key, build(child, child_names, plan)))


def _replace(template: object, node: Node, names: list[str], plan: Plan) -> object:
    """The checkpoint's value in place of a template value that holds no tensor."""
    if _contains_array(template):
        raise ValueError(f"cannot restore {_where(names)}: the checkpoint holds "
                         f"{describe_node(node)}, the given state {_describe(template)} with "
                         "tensors in it")
    return build(node, names, plan)


def template_leaves(value: object, names: list[str],
                    out: list[tuple[str, Array, list[str]]]) -> list[tuple[str, Array, list[str]]]:
    """(name, tensor or array, names) of every tensor of a template, its keys joined with "/"
    unescaped: the names of a checkpoint written without the Python layer, which {"a": {"b": x}}
    and {"a/b": x} both match."""
    if is_array(value):
        out.append(("/".join(names), value, names))
    elif isinstance(value, dict):
        for key, child in value.items():
            _dict_key_component(key, names)  # refuses keys no name can hold
            template_leaves(child, names + [str(key)], out)
    elif isinstance(value, (list, tuple)):
        for i, child in enumerate(value):
            template_leaves(child, names + [str(i)], out)
    return out
