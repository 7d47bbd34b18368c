"""asyncckpt.load into memory it allocates (issue 32 item 5): the pages of large tensors are
faulted in ahead of the reader, on threads of their own, and the reads go in batches. These
tests make the batches small, show that the pages were faulted in and the reads batched, and
check that what comes back is what was saved, bit for bit; never how fast it is."""

import argparse
import itertools
import mmap
import re
import resource
import sys
import threading

import numpy as np
import pytest
import torch

import asyncckpt
from asyncckpt import _core, _prefault
from conftest import import_benchmark

MIB = 1 << 20


@pytest.fixture
def spied(monkeypatch):
    """Small batches and pieces, and a record of every read_into call and every page range
    faulted in ahead of it. With ``record["wait_ahead"]`` set, the first read_into waits (on
    an event, up to a minute) until the fault threads have faulted in every later batch."""
    monkeypatch.setattr(_prefault, "BATCH_BYTES", 2 * MIB)
    monkeypatch.setattr(_prefault, "PIECE_BYTES", MIB)
    record = {"reads": [], "faulted": [], "threads": {}, "later": set(), "wait_ahead": False}
    ahead = threading.Event()
    populate = _prefault.populate

    def spy_populate(address, nbytes):
        done = populate(address, nbytes)
        record["faulted"].append((address, nbytes))
        record["threads"][address, nbytes] = threading.get_ident()
        if record["later"] <= set(record["faulted"]):
            ahead.set()
        return done

    monkeypatch.setattr(_prefault, "populate", spy_populate)
    original = _prefault.read_into_new_memory

    class SpyReader:
        def __init__(self, reader):
            self._reader = reader

        def read_into(self, specs, boxes):
            if record["wait_ahead"] and not record["reads"]:
                assert ahead.wait(60), "the fault threads did not go ahead of the reader"
            record["reads"].append([spec[0] for spec in specs])
            self._reader.read_into(specs, boxes)

    def spy_read(reader, specs, boxes):
        later = [spec for run in _prefault.batches(specs)[1:] for spec in run]
        record["later"] = set(_prefault.pieces(later))
        if not record["later"]:
            ahead.set()
        original(SpyReader(reader), specs, boxes)

    monkeypatch.setattr(_prefault, "read_into_new_memory", spy_read)
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


def address_and_size(value):
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0], value.nbytes
    return value.data_ptr(), value.numel() * value.element_size()


def test_large_tensors_come_back_bit_exact_the_later_batches_faulted_in_ahead(ckpt_dir,
                                                                             spied):
    state = {
        "f32": random_bits((3 * MIB // 4,), torch.float32, 1),  # 3 MiB: three pieces
        "bf16": random_bits((1024, 1024), torch.bfloat16, 2),  # 2 MiB
        "f64": random_bits((256, 1024), torch.float64, 3),  # 2 MiB
        "numpy": random_bits((2 * MIB,), torch.uint8, 4).numpy(),
        "small": random_bits((10,), torch.float32, 5),  # below MIN_PREFAULT_BYTES
    }
    spied["wait_ahead"] = True
    loaded = asyncckpt.load(save(ckpt_dir, state))
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert same_bits(value, loaded[key]), key
    # Batches of 2 (f32 alone is more), 4 and 8 MiB, in the saved order.
    assert [sorted(batch) for batch in spied["reads"]] == [["f32"], ["bf16", "f64"],
                                                          ["numpy", "small"]]
    # Every byte of the large tensors was faulted in ahead of its read, once; the later
    # batches' by the fault threads while the reader was on the first; no memory but the
    # large destinations was touched.
    for key in ("f32", "bf16", "f64", "numpy"):
        address, nbytes = address_and_size(loaded[key])
        assert sum(n for a, n in spied["faulted"] if address <= a < address + nbytes) == nbytes
    assert len(set(spied["faulted"])) == len(spied["faulted"])
    assert all(spied["threads"][piece] != threading.get_ident() for piece in spied["later"])
    ranges = [address_and_size(loaded[key]) for key in ("f32", "bf16", "f64", "numpy")]
    for a, n in spied["faulted"]:
        assert any(start <= a and a + n <= start + size for start, size in ranges)


def test_pieces_cover_the_large_host_tensors_exactly_and_nothing_else(monkeypatch):
    monkeypatch.setattr(_prefault, "PIECE_BYTES", MIB)
    specs = [("big", "f32", [3], 1 << 30, 3 * MIB + 5, None),
             ("small", "f32", [3], 5 << 30, MIB - 1, None),
             ("gpu", "f32", [3], 7 << 30, 64 * MIB, 0)]
    pieces = _prefault.pieces(specs)
    assert pieces[0][0] == 1 << 30
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(pieces))
    assert sum(n for _, n in pieces) == 3 * MIB + 5
    assert [n for _, n in pieces] == [MIB, MIB, MIB, 5]


def test_batches_double_and_keep_the_order(monkeypatch):
    monkeypatch.setattr(_prefault, "BATCH_BYTES", 100)
    specs = [(f"t{i}", "u8", [50], 4096 * i, 50, None) for i in range(15)]
    runs = _prefault.batches(specs)
    assert [len(run) for run in runs] == [2, 4, 8, 1]
    assert [spec for run in runs for spec in run] == specs


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


# ---- map_location (issue 32 item 4) -----------------------------------------------------------


@pytest.fixture
def mixed(ckpt_dir):
    """A checkpoint of a torch tensor, a bfloat16 one, a NumPy array and a value."""
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
             "h": torch.ones(4, dtype=torch.bfloat16), "n": np.arange(3, dtype=np.int16),
             "step": 7}
    return save(ckpt_dir, state), state


@pytest.mark.parametrize("location", ["cpu", torch.device("cpu"), "cpu:0"])
def test_map_location_cpu_puts_tensors_on_the_cpu_and_leaves_arrays_numpy(mixed, location):
    path, state = mixed
    loaded = asyncckpt.load(path, map_location=location)
    assert loaded["w"].device == torch.device("cpu") and torch.equal(loaded["w"], state["w"])
    assert loaded["h"].dtype == torch.bfloat16 and torch.equal(loaded["h"], state["h"])
    assert isinstance(loaded["n"], np.ndarray) and loaded["n"].tolist() == [0, 1, 2]
    assert loaded["step"] == 7


def test_the_managers_load_takes_map_location_too(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=False) as manager:
        manager.save(3, {"w": torch.full((5,), 2.5)})
        loaded = manager.load(map_location=torch.device("cpu"))
        with pytest.raises(ValueError, match="'tpu'"):
            manager.load(map_location="tpu")
    assert torch.equal(loaded["w"], torch.full((5,), 2.5))


def test_a_directory_loads_with_map_location(mixed, ckpt_dir):
    loaded = asyncckpt.load(ckpt_dir, map_location="cpu")
    assert torch.equal(loaded["w"], mixed[1]["w"])


@pytest.mark.parametrize("location", ["gpu", "cuda:x", ""])
def test_a_string_that_is_no_device_is_a_value_error_naming_it(mixed, location):
    with pytest.raises(ValueError, match=f"map_location={location!r} is not a device"):
        asyncckpt.load(mixed[0], map_location=location)


def test_a_device_asyncckpt_cannot_read_into_is_refused_by_name(mixed):
    with pytest.raises(ValueError, match="'meta'.*not a meta device"):
        asyncckpt.load(mixed[0], map_location="meta")


@pytest.mark.parametrize("location", [{"cuda:1": "cuda:0"}, lambda storage, where: storage, 0])
def test_a_dict_a_function_or_a_number_is_a_type_error(mixed, location):
    with pytest.raises(TypeError, match="map_location"):
        asyncckpt.load(mixed[0], map_location=location)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("location", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_a_gpu_that_is_not_there_is_refused_before_anything_is_read(mixed, location,
                                                                     monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was opened")

    monkeypatch.setattr(_core, "open_reader", never)
    monkeypatch.setattr(_core, "find_resume_checkpoints", never)
    with pytest.raises(AssertionError, match="was opened"):  # the spies see a load that reads
        asyncckpt.load(mixed[0], map_location="cpu")
    with pytest.raises(ValueError, match=re.escape(f"map_location={location!r}: no CUDA GPU")):
        asyncckpt.load(mixed[0], map_location=location)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        asyncckpt.load(mixed[0].rsplit("/", 1)[0], map_location=location)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_map_location_cuda_loads_torch_tensors_onto_the_gpu(mixed):
    path, state = mixed
    loaded = asyncckpt.load(path, map_location="cuda:0")
    assert loaded["w"].device == torch.device("cuda", 0)
    assert torch.equal(loaded["w"].cpu(), state["w"])
    assert loaded["h"].device == torch.device("cuda", 0)
    assert torch.equal(loaded["h"].cpu(), state["h"])
    assert isinstance(loaded["n"], np.ndarray) and loaded["n"].tolist() == [0, 1, 2]
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"there is no cuda:{count}"):
        asyncckpt.load(path, map_location=f"cuda:{count}")


def test_a_gpu_that_is_not_there_with_a_working_torch_cuda_is_named(mixed, monkeypatch):
    # The index check, on a machine without a GPU: torch says one is there.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"there is no cuda:3; torch sees 1 GPU \(cuda:0"):
        asyncckpt.load(mixed[0], map_location="cuda:3")


# ---- benchmarks/load_vs_restore.py: it runs, and its report says what it measured ------------


@pytest.fixture
def bench():
    yield import_benchmark("load_vs_restore")
    sys.modules.pop("bench_proc", None)


@pytest.mark.parametrize(("text", "size"), [("2GiB", 2 << 30), ("512MiB", 512 << 20),
                                            ("1.5g", 3 << 29), ("4096", 4096)])
def test_the_benchmark_reads_sizes(bench, text, size):
    assert bench.parse_size(text) == size


@pytest.mark.parametrize("text", ["2 parsecs", "GiB", "-1GiB"])
def test_the_benchmark_refuses_a_size_it_cannot_read(bench, text):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
        bench.parse_size(text)


def test_the_benchmark_writes_a_row_per_round_and_the_ratio_of_the_medians(bench, tmp_path):
    out = tmp_path / "load.md"
    bench.main(["--size", "8MiB", "--tensors", "4", "--rounds", "3", "--dir", str(tmp_path),
                "--with-reader-faults", "--out", str(out)])
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 + 1  # header, rounds, median
    assert "load_in_reader s" in rows[0]
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 5 and all(float(cell.split()[0]) > 0 for cell in cells[1:])
    ratio = rows[-1].strip("|").split("|")[-1].strip()
    assert f"load / restore (medians): {ratio}, target <= 1.25" in text
    assert not (tmp_path / "load-vs-restore").exists()
