"""asyncckpt as an Orbax handler: an Orbax user keeps ``ocp.CheckpointManager`` and changes one
line, ``ocp.args.StandardSave(state)`` to ``asyncckpt.orbax.AsyncckptSave(state)``::

    import orbax.checkpoint as ocp
    import asyncckpt.orbax
    manager = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        save_interval_steps=100, max_to_keep=3))
    manager.save(step, args=asyncckpt.orbax.AsyncckptSave(state))
    state = manager.restore(step, args=asyncckpt.orbax.AsyncckptRestore(abstract_state))

Orbax keeps what is its own: the step directories (``<path>/<step>/<item>/``), their temporary
names and atomic rename, its metadata files, ``all_steps``, ``latest_step``, ``should_save``
and the keep policies. Inside an item's directory asyncckpt writes one checkpoint of its own
format (``model.ckpt-0/`` and its state file) through the C++ engine: ``async_save`` returns
once every array's device-to-host copy is done (on the CPU, once it holds a view of each
shard's buffer, which JAX neither donates nor frees while it is held), and the commit future,
which Orbax runs once its directory exists, gathers the shards, encodes, writes and syncs it.
``restore`` reads the boxes the target's shardings ask for, as
``asyncckpt.jax.CheckpointManager.restore`` does (the same code).

One process only: in a ``jax.distributed`` job use ``asyncckpt.jax.CheckpointManager``, whose
processes commit together; Orbax's own multi-host barriers would have to be joined with the
engine's, which this handler does not do yet.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import orbax.checkpoint as ocp

from . import _core, _dtypes, _jax_restore, _jax_tree, _logging, _tree
from . import manager as _manager

if TYPE_CHECKING:
    from etils import epath

__all__ = ["AsyncckptCheckpointHandler", "AsyncckptRestore", "AsyncckptSave"]

# The one step of asyncckpt's checkpoint inside an Orbax item directory: Orbax numbers steps.
_STEP = 0


class AsyncckptCheckpointHandler(ocp.AsyncCheckpointHandler):  # type: ignore[misc]
    """An Orbax ``AsyncCheckpointHandler`` whose checkpoints asyncckpt's engine writes.

    ``options`` are asyncckpt's (``asyncckpt.manager.option_names()``: ``compression``,
    ``chunk_bytes``, ``num_data_files``, ...), checked here (ValueError / TypeError naming a
    bad one). Register it for an item with ``ocp.handlers`` or let the args find it.
    """

    def __init__(self, **options: Any) -> None:
        self._options = _manager._saver_options(options)
        if self._options.save_steps is None and self._options.save_secs is None:
            self._options.save_steps = 1  # the C++ options need a schedule; save ignores it
        self._staging = _jax_tree.HostStaging()

    async def async_save(self, directory: epath.Path, item: Any = None,
                         args: AsyncckptSave | None = None) -> list[Any]:
        """Copies ``args.item`` to the host now; returns the future that writes it."""
        if args is not None:
            item = args.item
        allow_pickle = bool(args.allow_pickle) if args is not None else False
        # On the CPU the shards are gathered by the commit (asyncckpt._jax_tree.flatten).
        leaves, metadata, later = _jax_tree.flatten(
            item, self._staging, lambda plain: _manager._flatten(plain, allow_pickle),
            defer=True)

        async def write() -> None:
            # The leaves own the host copies (or views) until the engine has written them.
            if later is not None:
                later.run()
            core = _core.Checkpointer(os.fspath(directory), self._options, False, None)
            try:
                core.save(_STEP, [leaf.spec() for leaf in leaves], metadata,
                          _manager._boxes(leaves))
                core.close()
            finally:
                _logging.drain()

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(),
                                                                 name="asyncckpt_save")]

    def save(self, directory: epath.Path, item: Any = None,
             args: AsyncckptSave | None = None) -> None:
        """Saves and waits until the checkpoint is durable."""
        import asyncio

        async def run() -> None:
            for commit in await self.async_save(directory, item, args):
                commit.result()

        asyncio.run(run())

    def restore(self, directory: epath.Path, item: Any = None,
                args: AsyncckptRestore | None = None) -> Any:
        """The pytree ``args.item`` restored (see asyncckpt.jax.CheckpointManager.restore); with
        no item, what was saved, as ``asyncckpt.load`` gives it (NumPy arrays)."""
        if args is not None:
            item = args.item
        partial = bool(args.partial) if args is not None else False
        path = _core.latest_checkpoint(os.fspath(directory))
        if path is None:
            raise FileNotFoundError(f"{directory} holds no asyncckpt checkpoint")
        try:
            if item is None:
                return _manager.load(path)
            return _jax_restore.restore(_core.open_reader(path), item, partial)
        finally:
            _logging.drain()

    def metadata(self, directory: epath.Path) -> Any:
        """The saved tree with a ``jax.ShapeDtypeStruct`` (no sharding) for each array: a
        target for ``restore`` once shardings are added. None without a checkpoint."""
        path = _core.latest_checkpoint(os.fspath(directory))
        if path is None:
            return None
        try:
            root = _tree.read_tree(_core.open_reader(path).metadata(), path)
        finally:
            _logging.drain()
        return None if root is None else _abstract(root)

    def finalize(self, directory: epath.Path) -> None:
        """Nothing: the engine synced and committed the checkpoint in the commit future."""

    def close(self) -> None:
        """Frees the host staging."""
        self._staging = _jax_tree.HostStaging()


def _abstract(node: _tree.Node) -> Any:
    import jax

    if "T" in node or "A" in node:
        shape = tuple(node["sh"])
        return jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call]
            shape, _dtypes.numpy_or_ml_dtype(_tree.node_canonical(node)))
    if "d" in node:
        return {key: _abstract(child) for key, child in node["d"]}
    if "l" in node:
        return [_abstract(child) for child in node["l"]]
    if "t" in node:
        return tuple(_abstract(child) for child in node["t"])
    return _tree.decode_value(node)


@ocp.args.register_with_handler(AsyncckptCheckpointHandler, for_save=True)
@dataclasses.dataclass
class AsyncckptSave(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Saves ``item``, a pytree of jax.Array, NumPy arrays, scalars and stateful objects, with
    asyncckpt (in place of ``ocp.args.StandardSave``). ``allow_pickle`` as in asyncckpt."""

    item: Any
    allow_pickle: bool = False


@ocp.args.register_with_handler(AsyncckptCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class AsyncckptRestore(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Restores onto ``item``, a pytree of jax.ShapeDtypeStruct (with shardings) or arrays;
    None: what was saved, as NumPy arrays. ``partial`` keeps target leaves the checkpoint
    lacks instead of raising."""

    item: Any = None
    partial: bool = False
