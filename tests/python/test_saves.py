"""Each save returns a SaveFuture (its outcome, stats and own error), and stores the metrics
and metadata of its step, which manager.metadata(step) and `asyncckpt inspect` read back."""

import json
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest

import asyncckpt
from conftest import BUILD_DIR


def state(value=1.0):
    return {"w": np.full(1000, value, dtype=np.float32)}


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_save_returns_a_future_of_its_stats(ckpt_dir, asynchronous):
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=asynchronous) as manager:
        future = manager.save(3, state())
        assert isinstance(future, asyncckpt.SaveFuture) and future.step == 3
        stats = future.result(timeout=60)
        assert future.done() and future.exception() is None and future.stats == stats
        assert stats.ok and stats.step == 3 and stats.path == manager.checkpoint_path(3)
        assert stats.bytes_raw == 4000
        if not asynchronous:
            assert repr(future) == "<SaveFuture step=3 ok>"


def test_maybe_save_returns_a_future_when_it_saves_and_none_when_not(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=2) as manager:
        assert manager.maybe_save(1, state()) is None
        taken = manager.maybe_save(2, state())
        assert taken is not None and taken.result(timeout=60).step == 2


def test_restore_load_and_the_steps_wait_for_the_managers_own_saves_in_flight(ckpt_dir):
    big = {"w": np.arange(32 * 2**20, dtype=np.float32)}  # 128 MiB: still writing on return
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, big)
        assert manager.latest_step() == 1
        manager.save(2, big)
        assert manager.all_steps() == [1, 2]
        manager.save(3, big)
        target = {"w": np.zeros_like(big["w"])}
        assert manager.restore(target) == 3
        np.testing.assert_array_equal(target["w"], big["w"])
        manager.save(4, {"w": big["w"] + 1})
        np.testing.assert_array_equal(manager.load()["w"], big["w"] + 1)


def test_a_failed_save_raises_its_own_error_from_its_future(ckpt_dir):
    manager = asyncckpt.CheckpointManager(ckpt_dir, on_error="continue")
    good = manager.save(1, state())
    good.result(timeout=60)
    shutil.rmtree(ckpt_dir)
    ckpt_dir.write_text("not a directory")  # every later write fails
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        bad = manager.save(2, state(2.0))
        with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-2"):
            bad.result(timeout=60)
        manager.close()
    assert bad.done() and not bad.stats.ok
    assert isinstance(bad.exception(), asyncckpt.CheckpointError)
    assert good.result().ok  # an earlier future keeps its own outcome
    # The manager warns once about it (at the save or at close), though the future was asked.
    assert [str(w.message) for w in warned if "the save of step 2 failed" in str(w.message)], \
        [str(w.message) for w in warned]
    assert len([w for w in warned if "step 2 failed" in str(w.message)]) == 1


def test_metrics_and_metadata_of_a_step_are_read_back_by_any_manager(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state(), metrics={"loss": 0.5, "accuracy": 0.75},
                     metadata={"commit": "abc123", "epoch": 2})
        manager.save(2, state())
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        first = manager.metadata(1)
        assert first.step == 1 and first.path == manager.checkpoint_path(1)
        assert first.metrics == {"accuracy": 0.75, "loss": 0.5}
        assert first.metadata == {"commit": "abc123", "epoch": 2}
        latest = manager.metadata()
        assert latest.step == 2 and latest.metrics is None and latest.metadata is None
        with pytest.raises(FileNotFoundError):
            manager.metadata(7)


def test_asyncckpt_inspect_shows_a_steps_metrics(ckpt_dir):
    cli = BUILD_DIR / "bin" / "asyncckpt"
    if not cli.exists():
        pytest.skip("no CLI in this build")
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(4, state(), metrics={"loss": 0.25})
    shown = subprocess.run([str(cli), "inspect", "--json", os.path.join(ckpt_dir, "model.ckpt-4")],
                           capture_output=True, text=True, check=True).stdout
    user = json.loads(shown)["user_metadata"]
    assert json.loads(user["asyncckpt.python.metrics"]) == {"loss": 0.25}


@pytest.mark.parametrize("metrics, error, message", [
    ({"loss": object()}, TypeError, "metrics must hold JSON values"),
    ({1: 0.5}, TypeError, "metrics keys must be str"),
    ([("loss", 0.5)], TypeError, "metrics must be a dict"),
])
def test_metrics_that_are_not_json_are_refused_before_anything_is_written(ckpt_dir, metrics,
                                                                          error, message):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(error, match=message):
            manager.save(1, state(), metrics=metrics)
        assert manager.all_steps() == []
        manager.save(1, state())  # the step is still free
