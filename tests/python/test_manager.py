"""CheckpointManager and load(): saving, restoring in place, the tree of plain values, options,
schedules, failures and statistics."""

import collections
import inspect
import math
import os
import shutil
import struct
import subprocess
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import asyncckpt
from conftest import BUILD_DIR


def sample_state():
    torch.manual_seed(0)
    return {
        "model": collections.OrderedDict(
            [("fc.weight", torch.randn(4, 3)), ("fc.bias", torch.randn(4))]),
        "table": np.arange(12, dtype=np.int32).reshape(3, 4),
        "step": 7,
        "name": "digits",
    }


def assert_same(a, b, where="root"):
    """Equal in type and value, bit for bit, all the way down."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() == \
            b.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    else:
        assert a == b, where


def test_restore_fills_the_given_tensors_in_place_and_returns_the_step(ckpt_dir):
    saved = sample_state()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(7, saved)
    fresh = {"model": collections.OrderedDict(
                [("fc.weight", torch.zeros(4, 3)), ("fc.bias", torch.zeros(4))]),
             "table": np.zeros((3, 4), dtype=np.int32), "step": 0, "name": ""}
    weight = fresh["model"]["fc.weight"]
    table = fresh["table"]
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(fresh) == 7
    assert fresh["model"]["fc.weight"] is weight and fresh["table"] is table
    assert_same(fresh, saved)


def test_restore_of_an_empty_directory_returns_none_and_changes_nothing(ckpt_dir):
    state = sample_state()
    before = {key: value.clone() for key, value in state["model"].items()}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state) is None
        assert manager.latest_step() is None and manager.all_steps() == []
    for key, value in before.items():
        assert torch.equal(state["model"][key], value)


def test_the_state_returns_asyncckpt_load_exactly_with_every_kind_of_value(ckpt_dir):
    versions = collections.OrderedDict([("", {"version": 1}), ("fc", {"version": 2})])
    model = collections.OrderedDict([("w", torch.ones(2))])
    model._metadata = versions
    state = {
        "model": model,
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2)}},
                      "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0],
                                        "foreach": None, "amsgrad": False}]},
        "values": [None, True, False, 0, -(2**100), 1.5, -0.0, float("inf"), float("nan"),
                   struct.unpack("<d", bytes.fromhex("0100000000f8ff7f"))[0],  # NaN payload
                   complex(1.25, -2.0), "text with / and ~", b"\x00\xffbytes",
                   np.float32(0.1), np.int64(-5), np.bool_(True), np.uint16(65535)],
        "nested": ({"a": [np.zeros(0, dtype=np.float32)]}, ()),
        "keys": {"a/b": torch.arange(3), "a~1b": torch.arange(4), "": torch.arange(5),
                 7: torch.arange(6)},
        "empty": {}, "scalar_tensor": torch.tensor(2.5, dtype=torch.float64),
    }
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    assert_same(asyncckpt.load(path), state)
    assert_same(asyncckpt.load(ckpt_dir), state)  # the directory: its latest checkpoint


def test_tensor_names_are_the_escaped_key_paths(ckpt_dir):
    state = {"model": {"fc.weight": torch.ones(1)}, "a/b": {"c~d": torch.ones(1)},
             "": torch.ones(1), "list": [torch.ones(1)], 3: torch.ones(1)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
        path = manager.checkpoint_path(1)
    reader = asyncckpt._core.open_reader(path)
    names = sorted(name for name, *_ in reader.tensors())
    assert names == ["3", "a~1b/c~0d", "list/0", "model/fc.weight", "~e"]


def test_keys_that_would_share_a_name_are_refused_naming_both(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(ValueError, match=r"keys 0 and '0' of the dict at 'opt'"):
            manager.save(1, {"opt": {0: torch.ones(1), "0": torch.ones(1)}})
        assert manager.all_steps() == []


@pytest.mark.parametrize("value, message", [
    ({1, 2}, r"value at 'bad' is a builtins.set"),
    (object(), r"value at 'bad' is a builtins.object"),
    (np.array(["x"]), r"array at 'bad' has dtype <U1"),
    (torch.ones(2).to_sparse(), r"tensor at 'bad' has layout torch.sparse_coo"),
    (torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
     r"tensor at 'bad' is quantized"),
])
def test_values_that_cannot_be_stored_exactly_are_refused_naming_the_key(ckpt_dir, value, message):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(TypeError, match=message):
            manager.save(1, {"ok": torch.ones(1), "bad": value})
        assert manager.all_steps() == []


def test_non_contiguous_and_lazily_conjugated_tensors_are_saved_as_they_read(ckpt_dir):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    complex_base = torch.randn(3, dtype=torch.complex64)
    state = {"t": base.t(), "slice": base[:, ::2], "conj": complex_base.conj(),
             "neg": torch.randn(3, dtype=torch.complex64).conj().imag,
             "np": np.arange(20, dtype=np.float64).reshape(4, 5)[:, 1::2]}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
    loaded = asyncckpt.load(ckpt_dir)
    assert torch.equal(loaded["t"], base.t())
    assert torch.equal(loaded["slice"], base[:, ::2])
    assert torch.equal(loaded["conj"], complex_base.conj().resolve_conj())
    assert torch.equal(loaded["neg"], state["neg"].resolve_neg())
    np.testing.assert_array_equal(loaded["np"], state["np"])
    # And back into non-contiguous places.
    into = {"t": torch.zeros(4, 6).t(), "slice": torch.zeros(4, 6)[:, ::2],
            "conj": torch.zeros(3, dtype=torch.complex64), "neg": torch.zeros(3),
            "np": np.zeros((4, 5))[:, 1::2]}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(into) == 1
    assert torch.equal(into["t"], base.t())
    assert torch.equal(into["slice"], base[:, ::2])
    np.testing.assert_array_equal(into["np"], state["np"])


def test_a_shape_or_dtype_mismatch_names_the_key_and_changes_nothing(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"a": torch.ones(3), "b": torch.ones(2, 2), "n": 1})
    state = {"a": torch.zeros(3), "b": torch.zeros(2, 3), "n": 0}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(ValueError, match=r"'b'.*shape \(2, 2\).*shape \(2, 3\)"):
            manager.restore(state)
        assert torch.equal(state["a"], torch.zeros(3)) and state["n"] == 0
        state["b"] = torch.zeros(2, 2, dtype=torch.float64)
        with pytest.raises(ValueError, match=r"'b'.*dtype float32.*torch.float64"):
            manager.restore(state)
        state["b"] = torch.zeros(2, 2)
        state["extra"] = torch.zeros(1)
        with pytest.raises(ValueError, match=r"'extra' is in the given state but not in the"):
            manager.restore(state)


def test_restore_adds_what_a_fresh_optimizer_lacks_and_replaces_plain_values(ckpt_dir):
    saved = {"optimizer": {"state": {0: {"exp_avg": torch.randn(3)}},
                           "param_groups": [{"lr": 0.5, "betas": (0.8, 0.9), "params": [0]}]},
             "epoch": 3}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(5, saved)
    fresh = {"optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999),
                                                          "params": [0]}]},
             "epoch": None}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(fresh) == 5
    assert_same(fresh, saved)


@pytest.mark.parametrize("options, message", [
    ({"save_steps": 0}, "save_steps must be positive, got 0"),
    ({"save_interval_steps": 0}, "save_interval_steps must be positive, got 0"),
    ({"save_steps": 5, "save_secs": 1.0}, "not save_steps and save_secs"),
    ({"save_steps": 5, "save_interval_steps": 5}, "not save_steps and save_interval_steps"),
    ({"save_steps": 5, "max_to_keep": -1}, "max_to_keep must be >= 0"),
    ({"compression": "lz4"}, "compression must be 'none', 'zstd' or 'shuffle\\+zstd', got 'lz4'"),
    ({"on_busy": "drop"}, "on_busy must be 'wait' or 'skip', got 'drop'"),
    ({"on_error": "ignore"}, "on_error must be 'stop' or 'continue', got 'ignore'"),
    ({"compression_level": 99}, "level"),
    ({"basename": "a/b"}, "basename 'a/b'"),
])
def test_a_bad_option_raises_value_error_with_the_message_of_the_cpp_library(ckpt_dir, options,
                                                                              message):
    with pytest.raises(ValueError, match=message):
        asyncckpt.CheckpointManager(ckpt_dir, **options)


@pytest.mark.parametrize("options, message", [
    ({"max_to_keeep": 3}, "unknown option 'max_to_keeep'.*max_to_keep"),
    ({"queue_depth": "64"}, r"option queue_depth='64' cannot be set: expected a int"),
    ({"save_steps": 2.5}, r"option save_steps=2.5 cannot be set: expected None or a"),
    ({"save_steps": True}, r"option save_steps=True cannot be set"),
    ({"use_o_direct": "yes"}, r"option use_o_direct='yes' cannot be set: expected a bool"),
])
def test_an_unknown_or_ill_typed_option_raises_type_error_naming_it(ckpt_dir, options, message):
    with pytest.raises(TypeError, match=message):
        asyncckpt.CheckpointManager(ckpt_dir, **options)
    assert os.listdir(ckpt_dir) == []


def test_the_options_are_the_cpp_saver_options_with_their_defaults():
    names = asyncckpt.manager.option_names()
    assert {"save_steps", "save_secs", "max_to_keep", "queue_depth", "compression",
            "metadata", "cuda_stream_ordered"} <= set(names)
    defaults = asyncckpt._core.SaverOptions()
    assert (defaults.max_to_keep, defaults.compression, defaults.use_o_direct) == \
        (5, "shuffle+zstd", True)
    shown = inspect.signature(asyncckpt.CheckpointManager).parameters
    assert shown["queue_depth"].default == defaults.queue_depth
    assert shown["save_steps"].default is None
    assert set(names) | {"directory", "save_interval_steps", "asynchronous", "process_group",
                         "coordinator", "best_fn", "best_mode"} == set(shown)
    assert shown["best_mode"].default == "max" and shown["best_fn"].default is None


@pytest.mark.parametrize("asynchronous", [True, False])
def test_save_steps_follows_tensorflows_timer(ckpt_dir, asynchronous):
    """The first step seen, then the first step at least save_steps after the last save."""
    taken = []
    with asyncckpt.CheckpointManager(ckpt_dir, save_steps=3, max_to_keep=0,
                                     asynchronous=asynchronous) as manager:
        for step in range(2, 12):
            due = manager.should_save(step)
            assert (manager.maybe_save(step, {"w": torch.full((2,), float(step))}) is not None) == due
            if due:
                taken.append(step)
    assert taken == [2, 5, 8, 11]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_maybe_save_saves_the_multiples_of_save_interval_steps_as_orbax_does(ckpt_dir,
                                                                             asynchronous):
    state = {"w": torch.zeros(10)}
    taken = []
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=3, max_to_keep=0,
                                     asynchronous=asynchronous) as manager:
        for step in range(1, 11):
            state["w"].fill_(step)
            assert manager.should_save(step) == (step % 3 == 0)
            if manager.maybe_save(step, state):
                taken.append(step)
    assert taken == [3, 6, 9]
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.all_steps() == [3, 6, 9]
        for step in taken:
            assert torch.equal(manager.load(step)["w"], torch.full((10,), float(step)))


def test_maybe_save_without_a_schedule_is_refused(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, \
            pytest.raises(ValueError,
                          match="maybe_save needs save_steps, save_interval_steps or save_secs"):
        manager.maybe_save(1, {"w": torch.ones(1)})


def test_retention_keeps_the_newest_max_to_keep(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=2) as manager:
        for step in (10, 20, 30):
            manager.save(step, {"w": torch.full((4,), float(step))})
        manager.wait_until_finished()
        assert manager.all_steps() == [20, 30]
        assert manager.latest_step() == 30
    # The lock file stays (empty, unlocked): the next job locks the same inode.
    assert sorted(p for p in os.listdir(ckpt_dir) if p.startswith("model.ckpt-")) == \
        ["model.ckpt-20", "model.ckpt-30"]


def break_directory(path):
    """Replaces the checkpoint directory with a file: every later save fails to write."""
    shutil.rmtree(path)
    path.write_text("not a directory")


def heal_directory(path):
    path.unlink()
    path.mkdir()


def test_a_failed_background_save_raises_at_wait_and_at_every_later_call(ckpt_dir):
    manager = asyncckpt.CheckpointManager(ckpt_dir, save_steps=1)
    manager.save(1, {"w": torch.ones(4)})
    manager.wait_until_finished()
    break_directory(ckpt_dir)
    manager.save(2, {"w": torch.ones(4)})  # copied; the write fails in the background
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-2"):
        manager.wait_until_finished()
    heal_directory(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-2"):
        manager.save(3, {"w": torch.ones(4)})
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-2"):
        manager.maybe_save(4, {"w": torch.ones(4)})
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-2"):
        manager.close()
    assert not (ckpt_dir / "model.ckpt-3").exists()
    stats = manager.stats()
    assert stats.saves_failed == 1 and not stats.saves[-1].ok
    assert "model.ckpt-2" in stats.saves[-1].error


def test_a_failed_synchronous_save_raises_from_that_save(ckpt_dir):
    manager = asyncckpt.CheckpointManager(ckpt_dir, asynchronous=False)
    manager.save(0, {"w": torch.ones(4)})  # the manager takes the directory at its first save
    break_directory(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-1"):
        manager.save(1, {"w": torch.ones(4)})
    heal_directory(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-1"):
        manager.close()


def test_with_on_error_continue_a_failure_warns_and_saving_goes_on(ckpt_dir):
    manager = asyncckpt.CheckpointManager(ckpt_dir, on_error="continue", max_to_keep=1)
    manager.save(0, {"w": torch.ones(4)})  # the manager takes the directory at its first save
    manager.wait_until_finished()
    break_directory(ckpt_dir)
    # The failure is reported by the first call after it: the save itself when it fails fast.
    # Either call may be that one, so both sit in the block.
    with pytest.warns(RuntimeWarning, match="the save of step 1 failed"):  # noqa: PT031
        manager.save(1, {"w": torch.ones(4)})
        manager.wait_until_finished()
    heal_directory(ckpt_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manager.save(2, {"w": torch.ones(4)})
        manager.close()
    assert manager.all_steps() == [2]
    assert manager.stats().saves_failed == 1


def test_a_closed_manager_refuses_saves(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": torch.ones(1)})
    manager.close()  # idempotent
    with pytest.raises(asyncckpt.CheckpointError, match="closed"):
        manager.save(2, {"w": torch.ones(1)})


def test_stats_give_every_save_as_the_cpp_save_stats(ckpt_dir):
    state = {"w": torch.zeros(1000), "b": torch.ones(24, dtype=torch.float64)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
        manager.save(2, state)
    stats = manager.stats()
    assert stats.saves_committed == 2 and stats.saves_failed == 0
    assert [s.step for s in stats.saves] == [1, 2]
    first = stats.saves[0]
    assert first.ok and first.error is None
    assert first.path == manager.checkpoint_path(1)
    assert first.bytes_raw == 1000 * 4 + 24 * 8
    assert 0 < first.bytes_stored
    assert first.blocked_seconds > 0 and first.seconds_to_durable >= first.blocked_seconds
    assert sum(first.chunks_by_codec.values()) >= 2
    assert stats.bytes_raw == 2 * first.bytes_raw
    assert stats.staging_high_water_bytes > 0


def test_the_engine_call_releases_the_gil(ckpt_dir):
    # A thread that only counts runs exactly when the GIL is free: the count moves while the C++
    # save runs only if the save released the GIL.
    state = {"w": torch.randn(8 << 20)}
    leaves, metadata = asyncckpt._tree.flatten(state)
    specs = [leaf.spec() for leaf in leaves]
    counter = [0]
    done = threading.Event()

    def count():
        while not done.is_set():
            counter[0] += 1

    manager = asyncckpt.CheckpointManager(ckpt_dir, asynchronous=False, compression="zstd")
    thread = threading.Thread(target=count)
    thread.start()
    try:
        before = counter[0]
        manager._core.save(1, specs, metadata)
        after = counter[0]
    finally:
        done.set()
        thread.join()
        manager.close()
    assert after > before


def test_a_checkpoint_of_the_cpp_hooks_loads_as_a_flat_dict_and_restores_by_name(ckpt_dir):
    cli = BUILD_DIR / "bin" / "asyncckpt"
    if not cli.exists():
        pytest.skip(f"{cli} not built")
    subprocess.run([str(cli), "train-sim", "--steps", "2", "--save_steps", "1",
                    "--model_bytes", "64KiB", "--tensors", "2", "--checkpoint_dir",
                    str(ckpt_dir), "--quiet", "--memcpy_yardstick", "false"], check=True,
                   capture_output=True)
    loaded = asyncckpt.load(ckpt_dir)
    assert loaded and all("/" in name or name for name in loaded)
    assert all(isinstance(v, np.ndarray) for v in loaded.values())
    name, array = next(iter(loaded.items()))
    template = {name: np.zeros_like(array)}
    # A nested template names its tensors the same way.
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(template) == 2
    np.testing.assert_array_equal(template[name], array)


def test_load_of_a_path_without_checkpoints_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        asyncckpt.load(tmp_path)


def test_a_damaged_chunk_is_reported_by_restore_naming_the_file(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, compression="none") as manager:
        manager.save(1, {"w": torch.arange(4096, dtype=torch.float32)})
        path = manager.checkpoint_path(1)
    data = min(p for p in os.listdir(path) if p.startswith("data-"))
    with open(os.path.join(path, data), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, \
            pytest.raises(asyncckpt.CheckpointError, match=data):
        manager.restore({"w": torch.zeros(4096)})


def test_nan_and_infinities_survive_as_tensors_and_values(ckpt_dir):
    state = {"t": torch.tensor([math.nan, math.inf, -math.inf]), "v": [math.nan, -math.inf]}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
    assert_same(asyncckpt.load(ckpt_dir), state)


@pytest.mark.skipif(not torch.cuda.is_available() or not asyncckpt.cuda_available(),
                    reason="needs a GPU, a CUDA torch and asyncckpt built with CUDA")
def test_cuda_tensors_are_saved_through_the_cuda_device_and_restored_in_place(ckpt_dir):
    state = {"w": torch.randn(1 << 20, device="cuda"), "cpu": torch.randn(5)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state)
    loaded = asyncckpt.load(ckpt_dir)
    assert torch.equal(loaded["w"], state["w"].cpu())
    into = {"w": torch.zeros(1 << 20, device="cuda"), "cpu": torch.zeros(5)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(into)
    assert torch.equal(into["w"], state["w"])


def _truncate_data(checkpoint):
    data = checkpoint / "data-00000-of-00002"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def test_a_damaged_only_checkpoint_is_kept_and_never_a_silent_fresh_start(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=1) as manager:
        manager.save(10, {"w": torch.arange(100000, dtype=torch.float32)})
    _truncate_data(ckpt_dir / "model.ckpt-10")
    before = sorted(os.listdir(ckpt_dir))
    manager = asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=1)
    assert sorted(os.listdir(ckpt_dir)) == before, "constructing a manager changed the directory"
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-10"):
        manager.restore({"w": torch.zeros(100000)})
    # The first save quarantines it, and refuses to go on from step 0.
    with pytest.raises(asyncckpt.CheckpointError, match=r"model\.ckpt-10\.corrupt-"):
        manager.save(11, {"w": torch.zeros(4)})
    manager.close()
    quarantined = [p for p in os.listdir(ckpt_dir) if p.startswith("model.ckpt-10.corrupt-")]
    assert len(quarantined) == 1 and not (ckpt_dir / "model.ckpt-10").exists()
    with pytest.raises(asyncckpt.CheckpointError, match="quarantined"):
        asyncckpt.CheckpointManager(ckpt_dir).restore({})
    with asyncckpt.CheckpointManager(ckpt_dir, allow_fresh_start=True) as fresh:
        assert fresh.restore({}) is None
        fresh.save(0, {"w": torch.zeros(4)})
    assert (ckpt_dir / quarantined[0]).is_dir(), "a fresh start leaves it for a person"


def test_another_basename_beside_a_running_saver_is_refused_and_drops_nothing(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as model:
        model.save(1, {"w": torch.zeros(4)})
        model.wait_until_finished()
        other = asyncckpt.CheckpointManager(ckpt_dir, basename="other.ckpt")
        with pytest.raises(asyncckpt.CheckpointError, match="checkpoint.lock is held by pid"):
            other.save(7, {"w": torch.ones(4)})
        other.close()
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-1")
    assert "model.ckpt-1" in (ckpt_dir / "checkpoint").read_text()


@pytest.mark.parametrize("state, message", [
    ("cycle", "refers to itself"),
    ("deep", "deeper than 100"),
])
def test_a_cyclic_or_too_deep_state_is_a_clear_error(ckpt_dir, state, message):
    if state == "cycle":
        value = {"a": [1, 2]}
        value["a"].append(value)
    else:
        value = []
        for _ in range(5000):
            value = [value]
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(ValueError, match=message):
            manager.save(1, value)
        manager.save(1, {"w": torch.ones(1)})
        manager.wait_until_finished()
        with pytest.raises(ValueError, match=message):  # restoring into it is bounded too
            manager.restore(value if isinstance(value, list) else {"w": torch.ones(1), **value})


def test_chunk_bytes_below_the_cli_floor_is_refused(ckpt_dir):
    with pytest.raises(ValueError, match="chunk_bytes"):
        asyncckpt.CheckpointManager(ckpt_dir, chunk_bytes=1)
    asyncckpt.CheckpointManager(ckpt_dir, chunk_bytes=asyncckpt._core.MIN_CHUNK_BYTES).close()
