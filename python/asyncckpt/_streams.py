"""Stream-ordered saves of CUDA tensors: the compute stream a save's copies follow, the wait that
orders the optimizer's update after them, and the step pre-hook that places that wait."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

from . import _core

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch
    from torch.utils.hooks import RemovableHandle


class UpdateWaiter(Protocol):
    """What orders an optimizer's update after its snapshot copies: the manager, the Stager."""

    def wait_for_snapshot_copies(self) -> None:
        """Makes the current streams wait for the copies so far."""

    def _update_wait_removed(self) -> None:
        """One UpdateWaitHandle fewer."""


def check_gpu_visible() -> None:
    """cuda_stream_ordered=True with no GPU: a clear error now, rather than a silent no-op."""
    if not _core.cuda_available():
        raise RuntimeError("cuda_stream_ordered=True needs a CUDA GPU, and asyncckpt sees none "
                           "(no GPU is visible, or this build of asyncckpt has no CUDA device)")


def cuda_ordinals(specs: Iterable[_core.TensorSpec]) -> set[int]:
    """The GPUs whose memory a list of tensor specs names."""
    return {spec[5] for spec in specs if spec[5] is not None}


def _current_stream(ordinal: int) -> int:
    import torch  # only reached with CUDA tensors in hand, so torch is there

    return torch.cuda.current_stream(ordinal).cuda_stream


def follow_current_streams(ordinals: Iterable[int]) -> None:
    """Orders each GPU's next snapshot copies after the work queued on its current stream."""
    for ordinal in ordinals:
        _core.set_cuda_compute_stream(ordinal, _current_stream(ordinal))


def stop_following(ordinals: Iterable[int]) -> None:
    """Forgets the streams: the device must not keep a stream the caller may destroy."""
    for ordinal in ordinals:
        _core.set_cuda_compute_stream(ordinal, None)


def wait_on_current_streams(ordinals: Iterable[int]) -> None:
    """Makes each GPU's current stream wait (on the GPU, not the host) for its copies."""
    for ordinal in ordinals:
        _core.wait_for_copies_on_stream(ordinal, _current_stream(ordinal))


class UpdateWaitHandle:
    """What ``wait_before_update`` (of the manager or the Stager) returns; ``remove()`` takes the
    wait off the optimizer's step (and the saves wait right after the copy again)."""

    def __init__(self, manager: UpdateWaiter, optimizer: torch.optim.Optimizer) -> None:
        self._manager = weakref.ref(manager)
        self._active = True
        self._torch_handle: RemovableHandle = optimizer.register_step_pre_hook(self._pre_hook)

    def _pre_hook(self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> None:
        """Before each optimizer.step(): the update waits for the snapshot copies."""
        del optimizer, args, kwargs
        manager = self._manager()
        if self._active and manager is not None:
            manager.wait_for_snapshot_copies()

    def remove(self) -> None:
        """Takes the hook off; idempotent."""
        if not self._active:
            return
        self._active = False
        self._torch_handle.remove()
        manager = self._manager()
        if manager is not None:
            manager._update_wait_removed()  # pylint: disable=protected-access
