"""Checkpoints to safetensors and back, through the real `safetensors` package: what a torch or
NumPy state saved comes back bit for bit from safetensors.torch/numpy.load_file, bfloat16
included; files split as Hugging Face lays them out; bad input refused with nothing written."""

import json
import os

import numpy as np
import pytest

import asyncckpt

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
st_numpy = pytest.importorskip("safetensors.numpy")


def model_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)).to(torch.bfloat16)
    optimizer = {"exp_avg": torch.randn(16, 8), "step": 3}
    return {"model": model, "optimizer": optimizer}


def test_an_export_loads_in_safetensors_bit_exact_with_hugging_face_names(ckpt_dir, tmp_path):
    state = model_state()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(5, state)
    files = asyncckpt.export_safetensors(ckpt_dir, tmp_path / "out", select="model.*")
    assert files == [str(tmp_path / "out" / "model.safetensors")]
    loaded = st_torch.load_file(files[0])
    expected = {f"model.{k}": v for k, v in state["model"].state_dict().items()}
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == torch.bfloat16
        assert torch.equal(loaded[name].view(torch.int16), tensor.view(torch.int16)), name


def test_a_split_export_is_laid_out_as_hugging_face_does(ckpt_dir, tmp_path):
    arrays = {f"layer{i}": np.full((256, 64), i, dtype=np.float32) for i in range(6)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, arrays)
    files = asyncckpt.export_safetensors(ckpt_dir, tmp_path / "out", max_shard_bytes=150_000)
    names = sorted(os.path.basename(f) for f in files)
    assert names[-1] == "model.safetensors.index.json" and len(names) == 4
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 6 * 256 * 64 * 4
    loaded = {}
    for name in set(index["weight_map"].values()):
        loaded.update(st_numpy.load_file(str(tmp_path / "out" / name)))
    assert sorted(loaded) == sorted(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)


def test_a_file_written_by_safetensors_imports_and_a_job_restores_from_it(tmp_path):
    module = torch.nn.Linear(4, 3)
    st_torch.save_file({f"model.{k}": v.detach() for k, v in module.state_dict().items()},
                       str(tmp_path / "model.safetensors"))
    path = asyncckpt.import_safetensors(tmp_path / "model.safetensors", tmp_path / "ckpt", step=10)
    assert path.endswith("model.ckpt-10")
    fresh = torch.nn.Linear(4, 3)
    with asyncckpt.CheckpointManager(tmp_path / "ckpt") as manager:
        assert manager.latest_step() == 10
        assert manager.restore({"model": fresh}) == 10
    assert torch.equal(fresh.weight, module.weight) and torch.equal(fresh.bias, module.bias)


def test_export_then_import_round_trips_through_numpy_bit_exact(ckpt_dir, tmp_path):
    arrays = {"a": np.arange(10, dtype=np.int64), "b": np.linspace(0, 1, 7).astype(np.float16),
              "c": np.array([True, False, True])}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(2, arrays)
    asyncckpt.export_safetensors(ckpt_dir, tmp_path / "out")
    asyncckpt.import_safetensors(tmp_path / "out", tmp_path / "again")
    back = asyncckpt.load(tmp_path / "again")
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype
        np.testing.assert_array_equal(back[name], array)


def test_bad_input_is_refused_naming_it_and_writes_nothing(ckpt_dir, tmp_path):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": np.ones(3)})
    with pytest.raises(ValueError, match="select 'decoder.*' matches none"):
        asyncckpt.export_safetensors(ckpt_dir, tmp_path / "out", select="decoder.*")
    assert not list((tmp_path / "out").glob("*safetensors*"))
    header = json.dumps({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(ValueError, match=r'tensor "a": dtype "C64"'):
        asyncckpt.import_safetensors(bad, tmp_path / "imported")
    assert not (tmp_path / "imported").exists() or not os.listdir(tmp_path / "imported")
