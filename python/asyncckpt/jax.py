"""asyncckpt for JAX: sharded jax.Array pytrees saved asynchronously by the C++ engine.

``CheckpointManager`` is asyncckpt's manager (the same options, schedules, step rules, futures,
Stateful leaves and "latest" rule) for pytrees whose leaves are ``jax.Array``, NumPy arrays,
Python scalars and stateful objects (a data iterator with ``state_dict`` /
``load_state_dict``)::

    import asyncckpt.jax
    with asyncckpt.jax.CheckpointManager("/tmp/ckpt", save_interval_steps=100) as manager:
        state = manager.restore(abstract_state) or state  # None: no checkpoint yet
        ...
        manager.maybe_save(step, state)

Each process writes the shards it addresses (a replica once); ``restore(target)`` lays every
array out as the target's sharding asks, on any mesh. With ``jax.distributed.initialize`` the
processes commit each step together or not at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from . import (
    _coordination,
    _core,
    _handoff,
    _jax_restore,
    _jax_tree,
    _logging,
    _pickled,
    _steps,
)
from . import manager as _manager

if TYPE_CHECKING:
    from collections.abc import Mapping

    from . import _tree
    from ._saves import SaveFuture

__all__ = ["CheckpointManager"]


class CheckpointManager(_manager.CheckpointManager):
    """asyncckpt.CheckpointManager for JAX pytrees (see the module's docstring).

    ``save`` starts every array's device-to-host copy (``copy_to_host_async``) at once, gathers
    the shards this process addresses into host staging kept across saves, and returns once the
    engine holds its copy; encoding and writing run in the background. ``coordinator``
    defaults to ``jax.distributed``'s processes when there are several.

    On the CPU platform (one process) ``save`` returns sooner: it keeps a view of each shard's
    device buffer, which JAX neither donates nor frees while it is held, so the gather and the
    engine's copy run on a thread of its own (asyncckpt._handoff) while training goes on; NumPy
    arrays of the state are copied first, as the caller may change them. The next call into the
    engine waits for that thread, and an error it met (the engine refused the save) fails the
    save's future and is raised by the next save, maybe_save, wait_until_finished or close.
    The save's SaveStats.blocked_seconds is then that thread's time in the engine.
    """

    def __init__(self, directory: _manager.StrPath, *,
                 coordinator: _core.Coordinator | None = None, **options: Any) -> None:
        import jax

        if coordinator is None and jax.process_count() > 1:
            coordinator = _coordination.jax_coordinator()
        super().__init__(directory, coordinator=coordinator, **options)
        self._staging = _jax_tree.HostStaging()
        self._later: _jax_tree.Gathers | None = None  # the gathers of the save being made
        self._handoff = _handoff.Handoff(self._saves, self._ledger)
        self._engine = self._core  # the hand-off's own way in, which must not wait for itself
        self._core = cast("_core.Checkpointer",
                          _handoff.EngineAfterHandoff(self._core, self._handoff))

    def _flatten_state(self, state: object,
                       allow_pickle: bool) -> tuple[list[_tree.Leaf], dict[str, str]]:
        self._handoff.join()  # the staging may still be read by the last hand-off
        leaves, metadata, self._later = _jax_tree.flatten(
            state, self._staging, lambda plain: super(CheckpointManager, self)._flatten_state(
                plain, allow_pickle), defer=self._coordinator is None)
        return leaves, metadata

    def _save_now(self, step: int, state: object, metrics: Mapping[str, object] | None,
                  metadata: Mapping[str, object] | None, allow_pickle: bool,
                  may_skip: bool) -> SaveFuture | None:
        self._handoff.settle()
        try:
            future = super()._save_now(step, state, metrics, metadata, allow_pickle, may_skip)
        except BaseException:
            self._handoff.drop_queued()
            raise
        if future is not None:
            self._handoff.start(future)
        return future

    def _hand_over(self, step: int, leaves: list[_tree.Leaf], metadata: dict[str, str],
                   may_skip: bool) -> bool:
        later, self._later = self._later, None
        if later is None or (may_skip and self._on_busy == "skip"):
            # Here and now: another platform, several processes, or a skip decided at once.
            if later is not None:
                later.run()
            return super()._hand_over(step, leaves, metadata, may_skip)

        def hand_over() -> None:
            later.run()
            specs = [leaf.spec() for leaf in leaves]
            boxes = _manager._boxes(leaves)
            if may_skip and not self._engine.maybe_save(step, specs, metadata, boxes):
                raise _core.CheckpointError(f"the save of step {step} was not taken")
            if not may_skip:
                self._engine.save(step, specs, metadata, boxes)

        self._handoff.queue(hand_over, self._ledger.latest)
        return True

    def _report_failure(self) -> None:
        if self._handoff.busy():  # reported at a later step: this one does not wait for it
            _logging.drain()
            return
        self._handoff.settle()
        super()._report_failure()

    def wait_until_finished(self) -> None:
        """As asyncckpt.CheckpointManager.wait_until_finished."""
        self._handoff.settle()
        super().wait_until_finished()

    def close(self) -> None:
        """As asyncckpt.CheckpointManager.close."""
        try:
            self._handoff.settle()
        finally:
            super().close()

    # The restored pytree is returned (jax arrays are immutable), where the base fills in place.
    def restore(self, target: Any, step: int | None = None, *,
                partial: bool = False, allow_pickle: bool = False) -> Any:
        """The pytree ``target`` restored from checkpoint ``step`` (the latest when None), or
        None when there is no checkpoint yet.

        ``target``'s leaves say what comes back: a ``jax.ShapeDtypeStruct`` (with a
        ``sharding``; none: the first device) or a ``jax.Array`` gives a jax.Array laid out as
        its sharding asks, whatever the mesh and sharding it was saved with; a NumPy array a
        new NumPy array; a stateful object is restored in place through ``load_state_dict``;
        anything else takes the saved value. A dtype or shape that does not match the saved
        one is a ValueError naming the leaf (nothing is read). A leaf the checkpoint lacks is a
        ValueError naming it, unless ``partial=True`` keeps the target's leaf.
        """
        self._saves.wait_all()  # a save this manager just made is restorable
        if step is None:
            step = self.latest_step()
            if step is None:
                self._refuse_to_start_afresh()
                return None
        try:
            reader = self._core.open(_steps.check_step(step))
            with _pickled.allowed(allow_pickle):
                return _jax_restore.restore(reader, target, partial)
        finally:
            _logging.drain()
