"""Every dtype torch and NumPy have that asyncckpt can store comes back bit for bit, through
load() and through restore() in place; the stored form is the C++ dtype (complex as pairs)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import asyncckpt

TORCH_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int8,
                torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32,
                torch.uint64, torch.bool, torch.complex64, torch.complex128, torch.complex32,
                torch.float8_e4m3fn, torch.float8_e5m2]

NUMPY_DTYPES = ["float64", "float32", "float16", "int8", "int16", "int32", "int64", "uint8",
                "uint16", "uint32", "uint64", "bool", "complex64", "complex128", ">f4", ">i8"]

STORED = {"complex32": ("f16", [3, 5, 2]), "complex64": ("f32", [3, 5, 2]),
          "complex128": ("f64", [3, 5, 2]), "bfloat16": ("bf16", [3, 5]), "bool": ("bool", [3, 5])}


def random_bytes_tensor(dtype, shape):
    """A tensor whose every byte is random (any bit pattern, NaNs included), bools 0 or 1."""
    generator = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (int(np.prod(shape)) * size,), generator=generator,
                        dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def tensor_bytes(tensor):
    return tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_a_torch_dtype_round_trips_bit_for_bit(ckpt_dir, dtype):
    state = {"x": random_bytes_tensor(dtype, (3, 5)), "scalar": random_bytes_tensor(dtype, ()),
             "empty": torch.empty(0, 4, dtype=dtype)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    loaded = asyncckpt.load(path)
    for key, value in state.items():
        assert loaded[key].dtype == dtype and loaded[key].shape == value.shape
        assert tensor_bytes(loaded[key]) == tensor_bytes(value), key
    into = {key: torch.zeros_like(value) for key, value in state.items()}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(into)
    for key, value in state.items():
        assert tensor_bytes(into[key]) == tensor_bytes(value), key
    name = str(dtype).replace("torch.", "")
    if name in STORED:
        stored = {n: (d, s) for n, d, s, _, _ in asyncckpt._core.open_reader(path).tensors()}
        assert stored["x"] == STORED[name]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_a_numpy_dtype_round_trips_bit_for_bit_in_its_byte_order(ckpt_dir, dtype):
    rng = np.random.default_rng(2)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        array = rng.integers(0, 2, (4, 3)).astype(bool)
    else:
        array = np.frombuffer(rng.bytes(12 * dtype.itemsize), dtype=dtype).reshape(4, 3).copy()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"a": array})
    loaded = asyncckpt.load(ckpt_dir)["a"]
    assert loaded.dtype == dtype and loaded.shape == array.shape
    assert loaded.tobytes() == array.tobytes()
    into = {"a": np.zeros_like(array)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(into)
    assert into["a"].tobytes() == array.tobytes()


def test_a_numpy_array_restores_into_a_torch_tensor_of_the_same_dtype(ckpt_dir):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"a": array})
    into = {"a": torch.zeros(2, 3)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(into)
    assert torch.equal(into["a"], torch.from_numpy(array))


def test_bfloat16_does_not_restore_into_numpy_which_lacks_it(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"a": torch.ones(2, dtype=torch.bfloat16)})
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, \
            pytest.raises(ValueError, match=r"'a'.*dtype bfloat16.*NumPy array.*float16"):
        manager.restore({"a": np.zeros(2, dtype=np.float16)})
