# ctest-labels: torchrun
"""asyncckpt.torch as torch.distributed.checkpoint's storage and stager: dcp.save, async_save
and load round-trip bit-exact in one process and across torchrun's ranks (FSDP2 state, loaded
on another number of ranks and into a plain state dict), a damaged byte makes dcp.load raise
naming the file and the tensor, a killed save leaves the checkpoints before it as they were,
and the CLI reads what the writer wrote."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import asyncckpt
import asyncckpt.torch as ackpt_torch
from conftest import BUILD_DIR, SOURCE_DIR

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP without a process group

WORKER = SOURCE_DIR / "tests" / "python" / "torchrun_dcp_worker.py"


def state() -> dict[str, object]:
    torch.manual_seed(0)
    return {"w": torch.randn(6, 5), "b": torch.arange(7, dtype=torch.int64),
            "nested": {"h": torch.randn(3, 2, dtype=torch.bfloat16),
                       "c": torch.randn(4, dtype=torch.complex64)},
            "blob": io.BytesIO(b"tokenizer bytes"), "epoch": 3, "name": "run-1"}


def zeros_like(value: object) -> object:
    if isinstance(value, dict):
        return {key: zeros_like(item) for key, item in value.items()}
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, io.BytesIO):
        return io.BytesIO()
    return type(value)()


def assert_same(expected: object, loaded: object) -> None:
    if isinstance(expected, dict):
        assert isinstance(loaded, dict) and set(expected) == set(loaded)
        for key in expected:
            assert_same(expected[key], loaded[key])
    elif isinstance(expected, torch.Tensor):
        assert isinstance(loaded, torch.Tensor) and loaded.dtype == expected.dtype
        assert torch.equal(expected, loaded)
    elif isinstance(expected, io.BytesIO):
        assert isinstance(loaded, io.BytesIO) and loaded.getvalue() == expected.getvalue()
    else:
        assert loaded == expected


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD_DIR / "bin" / "asyncckpt"), *args], check=False,
                          capture_output=True, text=True, timeout=120)


def test_dcp_save_and_load_round_trip_tensors_bytes_and_values(ckpt_dir):
    saved = state()
    dcp.save(saved, storage_writer=ackpt_torch.StorageWriter(ckpt_dir))
    saved["blob"].seek(0)
    loaded = zeros_like(saved)
    dcp.load(loaded, storage_reader=ackpt_torch.StorageReader(ckpt_dir))
    assert_same(saved, loaded)


def test_each_save_is_the_next_step_and_the_reader_takes_the_latest_or_the_step_asked(ckpt_dir):
    saved = state()
    dcp.save(saved, storage_writer=ackpt_torch.StorageWriter(ckpt_dir))
    first_w = saved["w"].clone()
    saved["w"].add_(1)
    dcp.save(saved, storage_writer=ackpt_torch.StorageWriter(ckpt_dir))
    assert asyncckpt.CheckpointManager(ckpt_dir).all_steps() == [0, 1]
    latest, first = zeros_like(saved), zeros_like(saved)
    dcp.load(latest, storage_reader=ackpt_torch.StorageReader(ckpt_dir))
    dcp.load(first, storage_reader=ackpt_torch.StorageReader(ckpt_dir, step=0))
    assert torch.equal(latest["w"], saved["w"]) and torch.equal(first["w"], first_w)
    one = zeros_like(saved)
    dcp.load(one, storage_reader=ackpt_torch.StorageReader(ckpt_dir / "model.ckpt-0"))
    assert torch.equal(one["w"], first_w)


def test_a_flipped_byte_makes_dcp_load_raise_naming_the_file_and_the_tensor(ckpt_dir):
    dcp.save({"w": torch.randn(256, 64)}, storage_writer=ackpt_torch.StorageWriter(
        ckpt_dir, compression="none"))
    data_files = sorted((ckpt_dir / "model.ckpt-0").glob("data-*"))
    damaged = max(data_files, key=lambda path: path.stat().st_size)
    content = bytearray(damaged.read_bytes())
    content[100] ^= 0x40
    damaged.write_bytes(bytes(content))
    # DCP gathers each rank's error into a CheckpointException (a BaseException).
    with pytest.raises(CheckpointException, match=rf"{damaged.name}.*tensor 'w'.*checksum mismatch"):
        dcp.load({"w": torch.zeros(256, 64)}, storage_reader=ackpt_torch.StorageReader(ckpt_dir))


def test_async_save_with_the_stager_reuses_its_buffers_across_saves(ckpt_dir):
    saved = {"w": torch.randn(32, 32), "step": 1}
    stager = ackpt_torch.Stager()
    dcp.async_save(saved, storage_writer=ackpt_torch.StorageWriter(ckpt_dir),
                   async_stager=stager).result()
    buffers = [buffer.data_ptr() for buffer in stager._buffers.values()]
    first_w = saved["w"].clone()
    saved["w"].mul_(2)
    saved["step"] = 2
    dcp.async_save(saved, storage_writer=ackpt_torch.StorageWriter(ckpt_dir),
                   async_stager=stager).result()
    assert [buffer.data_ptr() for buffer in stager._buffers.values()] == buffers
    stager.close()
    for step, expected_w, expected_step in ((0, first_w, 1), (1, saved["w"], 2)):
        loaded = {"w": torch.zeros(32, 32), "step": 0}
        dcp.load(loaded, storage_reader=ackpt_torch.StorageReader(ckpt_dir, step=step))
        assert torch.equal(loaded["w"], expected_w) and loaded["step"] == expected_step


def test_a_manager_checkpoint_loads_with_dcp_into_a_plain_state_dict(ckpt_dir):
    model = torch.nn.Linear(3, 2)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(5, {"model": model, "step": 5, "config": {"lr": 0.5}})
    plain = {"model": torch.nn.Linear(3, 2).state_dict(), "step": 0, "config": {"lr": 0.0}}
    dcp.load(plain, storage_reader=ackpt_torch.StorageReader(ckpt_dir))
    assert torch.equal(plain["model"]["weight"], model.weight.detach())
    assert torch.equal(plain["model"]["bias"], model.bias.detach())
    assert plain["step"] == 5 and plain["config"] == {"lr": 0.5}


def test_inspect_and_verify_read_what_the_writer_wrote(ckpt_dir):
    dcp.save(state(), storage_writer=ackpt_torch.StorageWriter(ckpt_dir))
    verified = cli("verify", str(ckpt_dir / "model.ckpt-0"))
    assert verified.returncode == 0, verified.stderr
    inspected = cli("inspect", str(ckpt_dir / "model.ckpt-0"), "--json")
    assert inspected.returncode == 0, inspected.stderr
    names = {tensor["name"] for tensor in json.loads(inspected.stdout)["tensors"]}
    assert {"w", "b", "nested.h", "nested.c", "blob"} <= names


def test_unknown_writer_options_are_refused_by_name(ckpt_dir):
    with pytest.raises(TypeError, match="StorageWriter got an unknown option 'compresion'"):
        ackpt_torch.StorageWriter(ckpt_dir, compresion="zstd")


KILLED_SAVE = """
import sys, torch, warnings
warnings.simplefilter("ignore")
import torch.distributed.checkpoint as dcp
import asyncckpt.torch
torch.manual_seed(int(sys.argv[2]))
state = {f"w{i}": torch.randn(1024, 1024) for i in range(24)}
print("saving", flush=True)
dcp.save(state, storage_writer=asyncckpt.torch.StorageWriter(sys.argv[1], compression="none"))
print("saved", flush=True)
"""


def test_a_save_killed_at_any_moment_leaves_the_checkpoints_before_it_intact(ckpt_dir):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-c", KILLED_SAVE, str(ckpt_dir), "0"], check=True, env=env,
                   timeout=300, capture_output=True)
    torch.manual_seed(0)
    first = {f"w{i}": torch.randn(1024, 1024) for i in range(24)}
    for delay in (0.05, 0.2, 0.4, 0.8):
        process = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(ckpt_dir), "1"],
                                   stdout=subprocess.PIPE, env=env, text=True)
        assert process.stdout is not None and process.stdout.readline() == "saving\n"
        time.sleep(delay)  # any moment will do: every outcome below must hold
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        manager_view = asyncckpt.CheckpointManager(ckpt_dir)
        steps = manager_view.all_steps()
        manager_view.close()
        assert steps[0] == 0
        # An interrupted step stays under its temporary name (model.ckpt-1.tmp-...).
        leftovers = [entry.name for entry in ckpt_dir.iterdir() if re.fullmatch(
            r"model\.ckpt-\d+", entry.name) and not (entry / "index").exists()]
        assert leftovers == [], f"a directory that looks like a checkpoint: {leftovers}"
        loaded = {name: torch.zeros(1024, 1024) for name in first}
        dcp.load(loaded, storage_reader=ackpt_torch.StorageReader(ckpt_dir, step=0))
        assert all(torch.equal(loaded[name], first[name]) for name in first)
        for step in steps[1:]:
            assert cli("verify", str(ckpt_dir / f"model.ckpt-{step}")).returncode == 0


def torchrun(ranks: int, mode: str, directory) -> list[str]:
    if shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("torchrun is not installed beside this Python")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
         "--nproc_per_node", str(ranks), str(WORKER), mode, str(directory)],
        check=False, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0 and "gloo" in done.stderr and "Connection" in done.stderr:
        pytest.skip(f"gloo cannot start here: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout.splitlines()


@pytest.mark.parametrize("save_mode", ["save", "async_save"])
def test_fsdp2_state_round_trips_on_two_ranks_and_reshards_to_three_and_one(ckpt_dir,
                                                                            save_mode):
    assert sorted(torchrun(2, save_mode, ckpt_dir)) == [f"0 {save_mode} done",
                                                        f"1 {save_mode} done"]
    verified = cli("verify", str(ckpt_dir / "model.ckpt-0"))
    assert verified.returncode == 0 and "sharded over 2 ranks" in verified.stdout
    assert sorted(torchrun(2, "load", ckpt_dir)) == ["0 load bit-exact", "1 load bit-exact"]
    if save_mode == "save":
        assert sorted(torchrun(3, "load", ckpt_dir)) == [f"{rank} load bit-exact"
                                                         for rank in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = subprocess.run([sys.executable, str(WORKER), "plain_load", str(ckpt_dir)],
                               check=False, capture_output=True, text=True, timeout=300)
    assert plain.stdout.splitlines()[-1:] == ["plain_load bit-exact"], plain.stderr[-4000:]
