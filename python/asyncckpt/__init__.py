"""asyncckpt for Python: checkpoints of PyTorch and NumPy training state, written in the
background by the C++ engine while training goes on.

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    with asyncckpt.CheckpointManager("/ckpt", save_interval_steps=100) as manager:
        manager.restore(state)  # calls model.load_state_dict(...) and the others' too
        for step in range(state["step"] + 1, last + 1):
            ...  # one training step
            state["step"] = step
            manager.maybe_save(step, state)  # saves when step % 100 == 0 (Orbax's rule)

Modules, optimizers, LR schedulers and any object with state_dict() / load_state_dict() are
stored as their state_dict() and restored through load_state_dict(), as
torch.distributed.checkpoint does it. The library's log lines go to
logging.getLogger("asyncckpt").
"""

from . import _logging
from ._core import CheckpointError, cuda_available
from ._interop import export_safetensors, import_safetensors
from ._saves import SaveFuture, SaveStats, Stats
from ._step_metadata import StepMetadata
from ._steps import StepAlreadyExistsError
from ._version import __version__
from .manager import CheckpointManager, latest_checkpoint, load

_logging.capture()

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "SaveFuture",
    "SaveStats",
    "Stats",
    "StepAlreadyExistsError",
    "StepMetadata",
    "__version__",
    "cuda_available",
    "export_safetensors",
    "import_safetensors",
    "latest_checkpoint",
    "load",
]
