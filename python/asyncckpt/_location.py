"""load()'s ``map_location``: where new torch tensors go, checked before anything is read.

torch.load's meaning, where asyncckpt can give it: a device string ("cpu", "cuda", "cuda:1") or
a torch.device puts every torch tensor there. NumPy arrays stay NumPy arrays in host memory. A
checkpoint does not record the device a tensor was saved from (load() brings every tensor to
the CPU), so torch.load's dict ({"cuda:1": "cuda:0"}) and callable forms, which map a saved
device, have nothing to map and are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def device_of(map_location: object) -> torch.device | None:
    """The device new torch tensors go to (None: the CPU) for ``map_location``.

    TypeError for a value of another kind, ValueError for a device string torch does not parse,
    a device asyncckpt cannot read into (only the CPU and CUDA GPUs) or a GPU that is not there.
    """
    if map_location is None:
        return None
    if isinstance(map_location, dict) or callable(map_location):
        raise TypeError(f"map_location={map_location!r}: asyncckpt takes a device (a string such "
                        "as 'cpu' or 'cuda:0', or a torch.device); a checkpoint does not record "
                        "the device each tensor was saved from, so there is nothing for a dict "
                        "or a function to map")
    if isinstance(map_location, str) and map_location == "cpu":
        return None  # needs no torch: a NumPy-only program may ask for the CPU
    try:
        import torch
    except ImportError:
        raise ValueError(f"map_location={map_location!r} needs torch, which is not installed; "
                         "without it everything loads to the CPU") from None
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device string or a torch.device, not a "
                        f"{type(map_location).__name__} ({map_location!r})")
    try:
        device = torch.device(map_location)
    except RuntimeError as error:
        raise ValueError(f"map_location={map_location!r} is not a device: {error}") from None
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"map_location={map_location!r}: asyncckpt loads into the CPU or a CUDA "
                         f"GPU, not a {device.type} device")
    if not torch.cuda.is_available():
        raise ValueError(f"map_location={map_location!r}: no CUDA GPU is visible to torch "
                         "(torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise ValueError(f"map_location={map_location!r}: there is no cuda:{index}; torch sees "
                         f"{count} GPU{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return torch.device("cuda", index)
