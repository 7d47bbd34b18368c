"""Step numbers are checked before anything is written: a bad step raises, names itself, leaves
no directory behind, and the manager goes on working."""

import os

import numpy as np
import pytest

import asyncckpt


def state(value=1.0):
    return {"w": np.full(4, value, dtype=np.float32)}


def entries(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("step, error, message", [
    (-1, ValueError, r"step must be in \[0, 2\*\*63 - 1\], got -1"),
    (2**63, ValueError, r"got 9223372036854775808"),
    (1.7, TypeError, r"step must be an int, not a float \(1.7\)"),
    (1.0, TypeError, r"not a float \(1.0\)"),
    ("3", TypeError, r"not a str \('3'\)"),
    (True, TypeError, r"not a bool \(True\)"),
    (None, TypeError, r"not a NoneType \(None\)"),
])
@pytest.mark.parametrize("call", ["save", "maybe_save"])
def test_a_bad_step_raises_naming_it_writes_nothing_and_the_manager_goes_on(
        ckpt_dir, step, error, message, call):
    with asyncckpt.CheckpointManager(ckpt_dir, save_steps=1) as manager:
        before = entries(ckpt_dir)
        with pytest.raises(error, match=message):
            getattr(manager, call)(step, state())
        assert entries(ckpt_dir) == before
        manager.save(5, state(5.0))
        assert manager.maybe_save(6, state(6.0))
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-6")
    assert not any("--" in name for name in entries(ckpt_dir))


def test_the_largest_step_and_numpy_integers_are_steps(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(np.int64(3), state())
        manager.save(2**63 - 1, state())
        manager.wait_until_finished()
        assert manager.all_steps() == [3, 2**63 - 1]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_saving_a_step_again_raises_step_already_exists_unless_forced(ckpt_dir, asynchronous):
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=asynchronous) as manager:
        manager.save(10, state(1.0))
        with pytest.raises(asyncckpt.StepAlreadyExistsError, match="step 10 is already saved"):
            manager.save(10, state(2.0))
        manager.wait_until_finished()
        assert np.array_equal(manager.load(10)["w"], state(1.0)["w"])
        manager.save(10, state(3.0), force=True)
        manager.wait_until_finished()
        assert np.array_equal(manager.load(10)["w"], state(3.0)["w"])


def test_a_step_below_the_latest_raises_unless_forced_also_after_a_restart(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(20, state())
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(asyncckpt.StepAlreadyExistsError,
                           match="step 7 is lower than the latest saved step 20"):
            manager.save(7, state())
        assert issubclass(asyncckpt.StepAlreadyExistsError, asyncckpt.CheckpointError)
        assert manager.latest_step() == 20
        manager.save(7, state(), force=True)
        manager.wait_until_finished()
        assert manager.all_steps() == [20, 7]
        # A forced lower step is a rollback: 7 is the latest, the rule compares with it.
        assert manager.latest_step() == 7
        with pytest.raises(asyncckpt.StepAlreadyExistsError, match="lower than the latest "
                                                                   "saved step 7"):
            manager.save(6, state())
        manager.save(8, state())


def test_maybe_save_never_saves_a_step_that_is_not_new(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=5) as manager:
        assert manager.maybe_save(10, state())
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=5) as manager:
        assert not manager.should_save(10) and not manager.maybe_save(10, state())
        assert not manager.should_save(5) and not manager.maybe_save(5, state())
        assert manager.should_save(15) and manager.maybe_save(15, state())
        manager.wait_until_finished()
        assert manager.all_steps() == [10, 15]


def test_checkpoint_numbers_survive_a_restart_with_save_interval_steps(ckpt_dir):
    """Orbax's rule: resumed from 9 with save_interval_steps=3, the next saves are 12 and 15."""
    taken = []
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=3, max_to_keep=0) as manager:
        for step in range(1, 11):
            if manager.maybe_save(step, state(step)):
                taken.append(step)
    with asyncckpt.CheckpointManager(ckpt_dir, save_interval_steps=3, max_to_keep=0) as manager:
        start = manager.latest_step()
        for step in range(start + 1, 17):
            if manager.maybe_save(step, state(step)):
                taken.append(step)
        manager.wait_until_finished()
        assert manager.all_steps() == [3, 6, 9, 12, 15]
    assert taken == [3, 6, 9, 12, 15]


@pytest.mark.parametrize("value, error", [(0, ValueError), (-3, ValueError),
                                          (2.5, TypeError), (True, TypeError)])
@pytest.mark.parametrize("option", ["save_steps", "save_interval_steps"])
def test_a_bad_save_steps_is_refused(ckpt_dir, option, value, error):
    with pytest.raises(error, match=option):
        asyncckpt.CheckpointManager(ckpt_dir, **{option: value})


def test_save_secs_keeps_the_timer_and_should_save_says_so(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, save_secs=3600) as manager:
        assert manager.should_save(1)
        assert manager.maybe_save(1, state())
        assert not manager.should_save(2) and not manager.maybe_save(2, state())
