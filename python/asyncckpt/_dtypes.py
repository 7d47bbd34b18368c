"""Element types: how a torch or NumPy dtype is stored with the C++ library's DType.

Every dtype maps to a C++ dtype short name ("f32", "bf16", ...) and a canonical name shared by
torch and NumPy ("float32", "bfloat16", ...), which restore compares. Complex dtypes, which the
C++ DType lacks, are stored as their real component type with a trailing dimension of 2 (real,
imaginary), byte for byte the same memory. Dtypes with no exact stored form (quantized torch
types, NumPy object, string, datetime and structured dtypes, float128) are refused with a
TypeError that names the tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

# canonical name -> (C++ dtype short name, complex: stored with a trailing dimension of 2)
STORED: dict[str, tuple[str, bool]] = {
    "float64": ("f64", False),
    "float32": ("f32", False),
    "float16": ("f16", False),
    "bfloat16": ("bf16", False),
    "float8_e4m3fn": ("f8e4m3", False),
    "float8_e5m2": ("f8e5m2", False),
    "int8": ("i8", False),
    "int16": ("i16", False),
    "int32": ("i32", False),
    "int64": ("i64", False),
    "uint8": ("u8", False),
    "uint16": ("u16", False),
    "uint32": ("u32", False),
    "uint64": ("u64", False),
    "bool": ("bool", False),
    "complex32": ("f16", True),
    "complex64": ("f32", True),
    "complex128": ("f64", True),
}

_NUMPY_NAMES = {
    "float64", "float32", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128",
}

# C++ dtype short name -> canonical name, for checkpoints written without a Python tree.
CANONICAL_OF_STORED = {stored: name for name, (stored, is_complex) in STORED.items()
                       if not is_complex}


def torch_dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32 (and 'complex32' for its alias torch.chalf)."""
    return str(dtype).replace("torch.", "")


def numpy_dtype_name(dtype: npt.DTypeLike) -> str:
    """'float32' for np.float32 (any byte order)."""
    return np.dtype(dtype).name


def stored_form(canonical: str, what: str) -> tuple[str, bool]:
    """(C++ dtype short name, complex) for a canonical dtype name, or TypeError naming `what`."""
    if canonical not in STORED:
        raise TypeError(
            f"{what} has dtype {canonical}, which asyncckpt cannot store exactly (supported: "
            f"{', '.join(sorted(STORED))}); convert it first (e.g. a quantized tensor's "
            "int_repr() and its scale)")
    return STORED[canonical]


def torch_dtype(canonical: str) -> torch.dtype | None:
    """The torch dtype of a canonical name, or None when this torch has none."""
    import torch

    dtype = getattr(torch, canonical, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def numpy_dtype(canonical: str) -> np.dtype[Any] | None:
    """The NumPy dtype of a canonical name, or None when NumPy has none (bfloat16, float8)."""
    return np.dtype(canonical) if canonical in _NUMPY_NAMES else None


def numpy_or_ml_dtype(canonical: str) -> np.dtype[Any]:
    """The NumPy dtype of a canonical name, from ml_dtypes (JAX's) for bfloat16 and float8."""
    dtype = numpy_dtype(canonical)
    if dtype is not None:
        return dtype
    import ml_dtypes  # installed with jax, which is what writes these dtypes as NumPy arrays

    found: np.dtype[Any] = np.dtype(getattr(ml_dtypes, canonical))
    return found
