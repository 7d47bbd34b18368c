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

from typing import TYPE_CHECKING, Any

from . import _coordination, _core, _jax_restore, _jax_tree, _logging, _pickled, _steps
from . import manager as _manager

if TYPE_CHECKING:
    from . import _tree

__all__ = ["CheckpointManager"]


class CheckpointManager(_manager.CheckpointManager):
    """asyncckpt.CheckpointManager for JAX pytrees (see the module's docstring).

    ``save`` starts every array's device-to-host copy (``copy_to_host_async``) at once, gathers
    the shards this process addresses into host staging kept across saves, and returns once the
    engine holds its copy; encoding and writing run in the background. ``coordinator``
    defaults to ``jax.distributed``'s processes when there are several.
    """

    def __init__(self, directory: _manager.StrPath, *,
                 coordinator: _core.Coordinator | None = None, **options: Any) -> None:
        import jax

        if coordinator is None and jax.process_count() > 1:
            coordinator = _coordination.jax_coordinator()
        super().__init__(directory, coordinator=coordinator, **options)
        self._staging = _jax_tree.HostStaging()

    def _flatten_state(self, state: object,
                       allow_pickle: bool) -> tuple[list[_tree.Leaf], dict[str, str]]:
        with _jax_tree.saving(state, self._staging):
            leaves, metadata = super()._flatten_state(_jax_tree.to_plain(state), allow_pickle)
        self._staging.drop_unused({leaf.name for leaf in leaves})
        return leaves, metadata

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

