"""Retention beyond max_to_keep, as Orbax's CheckpointManager does it: keep_period, and best-N by
best_fn / best_mode, saves without metrics (never deleted) and a reopen in the middle. Each
sequence of saves runs through Orbax's own manager and through asyncckpt's, and the steps they
keep must be the same after every save."""
# ctest-labels: jax

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import asyncckpt

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

REOPEN = "reopen"


def _orbax_kept(directory, options, sequence):
    """The steps Orbax keeps after each save of ``sequence`` (items: (step, metrics) or
    REOPEN)."""
    state = {"x": np.arange(4, dtype=np.float32)}
    kept = []
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False, **options))
    for item in sequence:
        if item == REOPEN:
            manager.close()
            manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=False, **options))
            continue
        step, metrics = item
        assert manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics)
        manager.wait_until_finished()
        kept.append(sorted(manager.all_steps()))
    manager.close()
    return kept


def _asyncckpt_kept(directory, options, sequence):
    """The steps asyncckpt's manager keeps after each save, checked against the directories."""
    state = {"x": np.arange(4, dtype=np.float32)}
    kept = []
    manager = asyncckpt.CheckpointManager(directory, asynchronous=False, **options)
    for item in sequence:
        if item == REOPEN:
            manager.close()
            manager = asyncckpt.CheckpointManager(directory, asynchronous=False, **options)
            continue
        step, metrics = item
        manager.save(step, state, metrics=metrics)
        steps = sorted(manager.all_steps())
        on_disk = sorted(int(name.rsplit("-", 1)[1]) for name in os.listdir(directory)
                         if name.startswith("model.ckpt-") and name[11:].isdigit())
        assert on_disk == steps, f"after step {step}: listed {steps}, on disk {on_disk}"
        kept.append(steps)
    manager.close()
    return kept


def _accuracy(metrics):
    return metrics["accuracy"]


def _loss(metrics):
    return metrics["loss"]


CASES = {
    "max_to_keep": ({"max_to_keep": 3}, [(step, None) for step in range(1, 8)]),
    "keep_period": ({"max_to_keep": 2, "keep_period": 4},
                    [(step, None) for step in range(1, 10)]),
    "best_max": ({"max_to_keep": 2, "best_fn": _accuracy, "best_mode": "max"},
                 [(step, {"accuracy": a}) for step, a in
                  enumerate([0.5, 0.9, 0.1, 0.7, 0.7, 0.95, 0.2, 0.7], start=1)]),
    "best_min": ({"max_to_keep": 3, "best_fn": _loss, "best_mode": "min"},
                 [(step, {"loss": v}) for step, v in
                  enumerate([3.0, 1.0, 2.5, 1.0, 0.5, 4.0, 1.0, 0.25, 2.0], start=1)]),
    "without_metrics_mixed_in": (
        {"max_to_keep": 2, "best_fn": _accuracy, "best_mode": "max", "keep_period": 5},
        [(1, {"accuracy": 0.3}), (2, None), (3, {"accuracy": 0.1}), (4, {"accuracy": 0.8}),
         (5, {"accuracy": 0.05}), (6, None), (7, {"accuracy": 0.9}), (8, {"accuracy": 0.85}),
         (9, {"accuracy": 0.01}), (10, {"accuracy": 0.02})]),
    "reopen_in_the_middle": (
        {"max_to_keep": 2, "best_fn": _loss, "best_mode": "min", "keep_period": 3},
        [(1, {"loss": 2.0}), (2, {"loss": 1.5}), (3, {"loss": 9.0}), (4, {"loss": 1.7}),
         REOPEN, (5, {"loss": 1.6}), (6, {"loss": 8.0}), (7, None), (8, {"loss": 0.5}), REOPEN,
         (9, {"loss": 3.0}), (10, {"loss": 1.0})]),
    "reopen_newest": ({"max_to_keep": 2, "keep_period": 3},
                      [(1, None), (2, None), (3, None), (4, None), REOPEN, (5, None), (6, None),
                       (7, None)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_keeps_the_steps_orbax_keeps(tmp_path, case):
    options, sequence = CASES[case]
    expected = _orbax_kept(tmp_path / "orbax", options, sequence)
    assert _asyncckpt_kept(tmp_path / "asyncckpt", options, sequence) == expected


def test_keep_period_example_of_the_docs(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=2, keep_period=4,
                                     asynchronous=False) as manager:
        for step in range(1, 9):
            manager.save(step, {"x": np.zeros(2)})
        assert manager.all_steps() == [4, 7, 8]


def test_the_score_is_stored_in_the_checkpoint(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=1, best_fn=_loss,
                                     best_mode="min", asynchronous=False) as manager:
        manager.save(1, {"x": np.zeros(2)}, metrics={"loss": 0.1})
        manager.save(2, {"x": np.zeros(2)}, metrics={"loss": 0.2})
        assert manager.all_steps() == [1]
        assert manager.metadata(1).metrics == {"loss": 0.1}
    metadata = asyncckpt._core.open_reader(str(ckpt_dir / "model.ckpt-1")).metadata()
    assert metadata[asyncckpt._core.RETENTION_SCORE_KEY] == "0.1"


@pytest.mark.parametrize(("options", "message"), [
    ({"best_fn": _loss, "max_to_keep": 0}, "best_fn needs max_to_keep > 0"),
    ({"best_fn": _loss, "best_mode": "lowest"}, "best_mode must be 'max' or 'min', not 'lowest'"),
    ({"keep_period": -1}, "keep_period must be >= 0"),
])
def test_bad_retention_options_are_value_errors_naming_them(ckpt_dir, options, message):
    with pytest.raises(ValueError, match=message):
        asyncckpt.CheckpointManager(ckpt_dir, **options)


def test_best_fn_must_be_callable(ckpt_dir):
    with pytest.raises(TypeError, match="best_fn must be a callable"):
        asyncckpt.CheckpointManager(ckpt_dir, best_fn="loss")


def test_best_mode_goes_with_best_fn_not_with_the_saver_options(ckpt_dir):
    assert "best_mode" not in asyncckpt.manager.option_names()
    assert "keep_period" in asyncckpt.manager.option_names()
    with pytest.raises(TypeError, match="unknown option 'best'.* best_fn, best_mode"):
        asyncckpt.CheckpointManager(ckpt_dir, best=_loss)


def _raises(metrics):
    raise KeyError("accuracy")


@pytest.mark.parametrize(("best_fn", "error", "message"), [
    (_raises, ValueError, r"best_fn raised on the metrics of step 3 \(KeyError"),
    (lambda metrics: math.nan, ValueError, "best_fn returned nan .* must be finite"),
    (lambda metrics: -math.inf, ValueError, "best_fn returned -inf"),
    (lambda metrics: "0.5", TypeError, "best_fn must return a number.*str"),
    (lambda metrics: True, TypeError, "best_fn must return a number.*bool"),
    (lambda metrics: [0.5], TypeError, "best_fn must return a number.*list"),
])
def test_a_bad_score_fails_the_save_before_anything_is_written(ckpt_dir, best_fn, error,
                                                                message):
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=2, best_fn=best_fn,
                                     asynchronous=False) as manager:
        with pytest.raises(error, match=message):
            manager.save(3, {"x": np.zeros(2)}, metrics={"loss": 1.0})
        assert manager.all_steps() == []
    assert not any(name.startswith("model.ckpt-") for name in os.listdir(ckpt_dir))


def test_numpy_and_jax_scalars_are_scores(ckpt_dir):
    scores = iter([np.float32(0.5), jax.numpy.asarray(0.25), np.asarray(0.75)])
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=2, best_fn=lambda m: next(scores),
                                     best_mode="min", asynchronous=False) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"x": np.zeros(2)}, metrics={"loss": 0.0})
        assert manager.all_steps() == [1, 2]


def test_maybe_save_carries_the_score(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=1, max_to_keep=1,
                                     best_fn=_accuracy, asynchronous=False) as manager:
        for step, accuracy in [(1, 0.2), (2, 0.9), (3, 0.5)]:
            assert manager.maybe_save(step, {"x": np.zeros(2)}, metrics={"accuracy": accuracy})
        assert manager.all_steps() == [2]


def test_the_jax_manager_keeps_the_best(ckpt_dir):
    import asyncckpt.jax as ajax

    with ajax.CheckpointManager(ckpt_dir, max_to_keep=2, best_fn=_accuracy, keep_period=10,
                                asynchronous=False) as manager:
        for step, accuracy in enumerate([0.1, 0.8, 0.3, 0.9, 0.05], start=1):
            manager.save(step, {"w": jax.numpy.full((3,), float(step))},
                         metrics={"accuracy": accuracy})
        assert sorted(manager.all_steps()) == [2, 4]
        restored = manager.restore({"w": jax.numpy.zeros((3,))}, step=4)
        assert np.asarray(restored["w"]).tolist() == [4.0, 4.0, 4.0]
