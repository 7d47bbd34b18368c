"""asyncckpt for Python: checkpoints of PyTorch and NumPy training state, written in the
background by the C++ engine while training goes on.

    manager = asyncckpt.CheckpointManager("/ckpt", save_steps=100)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    start = manager.restore(state) or 0
    ...
    manager.maybe_save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    manager.close()
"""

from ._core import CheckpointError, cuda_available
from .manager import CheckpointManager, SaveStats, Stats, latest_checkpoint, load

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "SaveStats",
    "Stats",
    "cuda_available",
    "latest_checkpoint",
    "load",
]
