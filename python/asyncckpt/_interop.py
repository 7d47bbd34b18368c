"""Checkpoints to safetensors files and back: the form inference servers and model hubs load.

Both functions run the C++ library's ExportSafetensors / ImportSafetensors (what
`asyncckpt export` and `asyncckpt import` run), which check everything before they write:
an unknown dtype, tensors whose bytes overlap or leave a gap, a selection that matches nothing
or a name two tensors would share raise ValueError, and nothing is written.
"""

from __future__ import annotations

import os
from typing import Union

from . import _core, _logging, _steps

StrPath = Union[str, "os.PathLike[str]"]


def export_safetensors(checkpoint: StrPath, out_dir: StrPath, *, select: str | None = None,
                       max_shard_bytes: int = 0, keep_names: bool = False) -> list[str]:
    """Writes the tensors of ``checkpoint`` (a checkpoint, or a directory for its latest) as
    safetensors files into ``out_dir``; returns the paths written.

    Tensors are whole global tensors (also of a sharded checkpoint), dtypes kept (bfloat16
    included), named as Hugging Face names them: the checkpoint's "/"-joined key paths joined
    with "." instead ("model/fc.weight" -> "model.fc.weight"), unless ``keep_names``.
    ``select``: a glob over those names ("model.*") or a prefix. ``max_shard_bytes`` splits them
    into model-0000N-of-0000M.safetensors files and writes model.safetensors.index.json;
    0 writes one model.safetensors. A file already in ``out_dir`` is never replaced.
    """
    try:
        files, _, _ = _core.export_safetensors(os.fspath(checkpoint), os.fspath(out_dir),
                                               select or "", int(max_shard_bytes),
                                               bool(keep_names))
    finally:
        _logging.drain()
    return [os.path.join(os.fspath(out_dir), name) for name in files]


def import_safetensors(path: StrPath, checkpoint_dir: StrPath, *, step: int = 0,
                       basename: str = "model.ckpt", prefix: str = "",
                       compression: str = "shuffle+zstd") -> str:
    """Makes checkpoint ``step`` of ``checkpoint_dir`` from ``path`` (a .safetensors file, or a
    directory with model.safetensors.index.json or model.safetensors); returns its path.

    A job starts from it as from any checkpoint: ``CheckpointManager(checkpoint_dir)`` restores
    it; a state {"model": module} finds the file's "model.fc.weight" by its "."-joined keys, and
    ``prefix`` ("model/") puts the names of a file holding a module's own keys ("fc.weight")
    under one.
    """
    step = _steps.check_step(step)
    try:
        return _core.import_safetensors(os.fspath(path), os.fspath(checkpoint_dir), step, basename,
                                        prefix, compression)
    finally:
        _logging.drain()
