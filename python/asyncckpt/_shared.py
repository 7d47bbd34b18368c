"""Tensors that share memory (tied weights): stored once, shared again when loaded.

When two leaves of a state are the same memory (same address, dtype, shape and size: an
``nn.Module`` whose decoder weight is its embedding's), the checkpoint stores the tensor once,
under the first leaf's name, and the tree node of every later one says ``{"A": first name}``.
``load()`` puts the same tensor object at each such position; ``restore()`` fills the first
and copies it into any later one that is not the same memory in the given state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from typing import TypeAlias

    from ._tree import Array, Leaf, Node, Plan

    # What makes two leaves one memory: address, size, stored dtype and shape, device, and the
    # library and dtype they came from.
    _MemoryKey: TypeAlias = tuple[int, int, str, tuple[int, ...], int | None, str, str]


def _key(leaf: Leaf, node: Node) -> _MemoryKey:
    return (leaf.address, leaf.nbytes, leaf.stored_dtype, tuple(leaf.stored_shape), leaf.cuda,
            node["k"], node["dt"])


def _tensor_nodes(node: Node, out: list[Node]) -> list[Node]:
    """Every tensor node of a tree, in the order flatten visits them."""
    if "T" in node:
        out.append(node)
    for _, child in node.get("d", ()):
        _tensor_nodes(child, out)
    if "m" in node:
        _tensor_nodes(node["m"], out)
    for child in node.get("l", ()):
        _tensor_nodes(child, out)
    for child in node.get("t", ()):
        _tensor_nodes(child, out)
    return out


def dedupe(leaves: list[Leaf], root: Node) -> list[Leaf]:
    """Drops the leaves whose memory an earlier leaf already holds; their nodes become aliases.
    Returns the leaves to write."""
    nodes = {node["T"]: node for node in _tensor_nodes(root, [])}
    first: dict[_MemoryKey, str] = {}
    kept: list[Leaf] = []
    for leaf in leaves:
        node = nodes[leaf.name]
        if leaf.nbytes == 0:
            kept.append(leaf)
            continue
        key = _key(leaf, node)
        if key in first:
            node["A"] = first[key]
            del node["T"]
            continue
        first[key] = leaf.name
        kept.append(leaf)
    return kept


def is_alias(node: Node) -> bool:
    """True for the node of a tensor stored under an earlier one's name."""
    return "A" in node


def build_alias(node: Node, plan: Plan, where: str) -> Array:
    """The object already built for the tensor this node aliases."""
    built = plan.built.get(node["A"])
    if built is None:
        raise ValueError(f"the checkpoint's tree has {where} share '{node['A']}', which comes "
                         "before it in no tensor")
    return built


def fill_alias(template: Array, node: Node, plan: Plan, where: str) -> None:
    """Restores a tied tensor: the same memory as its first is filled already, else copied."""
    source = plan.built.get(node["A"])
    if source is None:
        raise ValueError(f"cannot restore {where}: it shares '{node['A']}', which the given "
                         "state does not hold before it")
    if tuple(source.shape) != tuple(template.shape) or source.dtype != template.dtype:
        raise ValueError(f"cannot restore {where}: it was saved as the tensor '{node['A']}', "
                         f"of shape {tuple(source.shape)} and dtype {source.dtype}")
    if _address(source) != _address(template):
        plan.copies.append((template, source))


def _address(array: Array) -> int:
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return array.data_ptr()
