"""asyncckpt.load into memory it allocates (issue 32 item 5): the pages of large tensors are
faulted in ahead of the reader, on threads of their own, and the reads go in batches. These
tests make the batches small, show that the pages were faulted in and the reads batched, and
check that what comes back is what was saved, bit for bit; never how fast it is."""

import mmap
import resource

import numpy as np
import pytest
import torch

import asyncckpt
from asyncckpt import _prefault

MIB = 1 << 20


@pytest.fixture
def spied(monkeypatch):
    """Small batches and pieces, and a record of every read_into call and every page range
    faulted in ahead of it."""
    monkeypatch.setattr(_prefault, "BATCH_BYTES", 2 * MIB)
    monkeypatch.setattr(_prefault, "PIECE_BYTES", MIB)
    record = {"reads": [], "faulted": []}
    populate = _prefault.populate

    def spy_populate(address, nbytes):
        record["faulted"].append((address, nbytes))
        return populate(address, nbytes)

    monkeypatch.setattr(_prefault, "populate", spy_populate)
    original = _prefault.read_into_new_memory

    class SpyReader:
        def __init__(self, reader):
            self._reader = reader

        def read_into(self, specs, boxes):
            record["reads"].append([spec[0] for spec in specs])
            self._reader.read_into(specs, boxes)

    monkeypatch.setattr(_prefault, "read_into_new_memory",
                        lambda reader, specs, boxes: original(SpyReader(reader), specs, boxes))
    return record


def random_bits(shape, dtype, seed):
    """A tensor of ``dtype`` holding random bit patterns (NaN payloads, -0.0, subnormals)."""
    generator = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (int(np.prod(shape)) * itemsize,), dtype=torch.uint8,
                        generator=generator)
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and torch.equal(a.contiguous().view(torch.uint8), b.view(torch.uint8)))


def save(ckpt_dir, state):
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=False) as manager:
        manager.save(1, state)
        return manager.checkpoint_path(1)


def test_large_tensors_come_back_bit_exact_read_in_batches_after_their_pages(ckpt_dir, spied):
    state = {
        "f32": random_bits((3 * MIB // 4,), torch.float32, 1),  # 3 MiB: three pieces
        "bf16": random_bits((1024, 1024), torch.bfloat16, 2),  # 2 MiB
        "f64": random_bits((256, 1024), torch.float64, 3),  # 2 MiB
        "numpy": random_bits((2 * MIB,), torch.uint8, 4).numpy(),
        "small": random_bits((10,), torch.float32, 5),  # below MIN_PREFAULT_BYTES
    }
    loaded = asyncckpt.load(save(ckpt_dir, state))
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert same_bits(value, loaded[key]), key
    assert len(spied["reads"]) >= 3, "the path under test reads in several batches"
    assert sorted(name for batch in spied["reads"] for name in batch) == sorted(state)
    # Every byte of every large destination was faulted in, and nothing of the small one.
    large = {key: value for key, value in loaded.items() if key != "small"}
    for key, value in large.items():
        address = (value.__array_interface__["data"][0] if isinstance(value, np.ndarray)
                   else value.data_ptr())
        nbytes = (value.nbytes if isinstance(value, np.ndarray)
                  else value.numel() * value.element_size())
        covered = sum(n for a, n in spied["faulted"] if address <= a < address + nbytes)
        assert covered == nbytes, key
    assert not any(loaded["small"].data_ptr() <= a < loaded["small"].data_ptr() + 40
                   for a, _ in spied["faulted"])


def test_tied_non_contiguous_zero_dim_and_empty_tensors_come_back_as_saved(ckpt_dir, spied):
    weight = random_bits((512, 1024), torch.float32, 6)  # 2 MiB, saved once for both keys
    wide = random_bits((1024, 1024), torch.float16, 7)
    state = {
        "embed": weight,
        "decoder": weight,
        "transposed": wide.t(),  # non-contiguous: saved contiguous, loaded with its values
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.empty((0, 7), dtype=torch.bfloat16),
        "nested": [random_bits((MIB,), torch.int8, 8), np.arange(5, dtype=">i4")],
    }
    loaded = asyncckpt.load(save(ckpt_dir, state))
    assert loaded["embed"] is loaded["decoder"]
    assert same_bits(weight, loaded["embed"])
    assert same_bits(wide.t().contiguous(), loaded["transposed"])
    assert loaded["scalar"].shape == () and loaded["scalar"].item() == 3.25
    assert loaded["empty"].shape == (0, 7) and loaded["empty"].dtype == torch.bfloat16
    assert same_bits(state["nested"][0], loaded["nested"][0])
    assert loaded["nested"][1].dtype == np.dtype(">i4")
    assert loaded["nested"][1].tolist() == [0, 1, 2, 3, 4]
    assert len(spied["reads"]) >= 2


def test_without_the_madvise_the_reader_faults_the_pages_and_the_values_are_the_same(
        ckpt_dir, spied, monkeypatch):
    monkeypatch.setattr(_prefault, "_libc_madvise", lambda: None)
    state = {"a": random_bits((MIB,), torch.float32, 9), "b": random_bits((MIB,), torch.int32, 10)}
    loaded = asyncckpt.load(save(ckpt_dir, state))
    assert same_bits(state["a"], loaded["a"]) and same_bits(state["b"], loaded["b"])
    assert spied["faulted"] == [] and len(spied["reads"]) == 1


def test_damage_in_a_later_batch_is_still_corruption(ckpt_dir, spied):
    state = {f"t{i}": random_bits((MIB // 2,), torch.float32, 20 + i) for i in range(4)}
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=False, compression="none",
                                     num_data_files=1) as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    data = f"{path}/data-00000-of-00001"
    with open(data, "r+b") as f:  # near the end: the last tensor's chunk
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(asyncckpt.CheckpointError, match="Corruption"):
        asyncckpt.load(path)
    assert len(spied["reads"]) >= 2, "the damaged tensor is read in a later batch"


def test_populate_faults_every_page_of_the_range_in():
    mapping = mmap.mmap(-1, 8 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(mapping, dtype=np.uint8)
    if not _prefault.populate(array.__array_interface__["data"][0], array.nbytes):
        pytest.skip("this kernel lacks MADV_POPULATE_WRITE (Linux 5.14)")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    array[::mmap.PAGESIZE] = 1  # one write per page: a fault each, unless already there
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 8 * MIB // mmap.PAGESIZE // 8
    del array
    mapping.close()


def test_a_fresh_mapping_without_populate_faults_on_every_page():
    # The other half of the test above: the fault count it reads does count these faults.
    mapping = mmap.mmap(-1, 8 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(mapping, dtype=np.uint8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    array[::mmap.PAGESIZE] = 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults >= 8 * MIB // mmap.PAGESIZE // 2
    del array
    mapping.close()
