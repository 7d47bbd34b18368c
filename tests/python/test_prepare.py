"""CheckpointManager.prepare: the engine and pinned staging exist before the first save, which
then costs what a later save costs, and the start-up cost is reported on its own. prepare()
returns at once and makes them in the background; a training job's resuming manager prepares by
itself."""

import logging

import numpy as np
import pytest

import asyncckpt


def state():
    return {"w": np.arange(1 << 18, dtype=np.float32), "b": np.ones(64, dtype=np.float64)}


def test_prepare_pays_the_start_up_before_the_first_save(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, max_to_keep=0)
    manager.prepare(state(), reserve_bytes=4 << 20)
    manager.wait_until_finished()  # awaits the preparation made in the background
    startup = manager.stats().startup_seconds
    assert startup > 0
    manager.save(1, state())
    grown = dict(state(), moments=np.zeros(1 << 16, dtype=np.float32))
    manager.save(2, grown)  # inside the reserve: no new engine
    manager.close()
    stats = manager.stats()
    assert stats.startup_seconds == startup
    assert stats.saves_committed == 2
    loaded = asyncckpt.load(manager.checkpoint_path(2))
    assert np.array_equal(loaded["moments"], grown["moments"])


def test_a_first_save_without_prepare_counts_the_start_up_as_blocked(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, max_to_keep=0)
    manager.save(1, state())
    manager.close()
    stats = manager.stats()
    assert stats.startup_seconds > 0
    assert stats.saves[0].blocked_seconds >= stats.startup_seconds


def test_a_save_right_after_prepare_waits_for_it_and_starts_up_once(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, max_to_keep=0)
    manager.prepare(state())
    manager.save(1, state())
    manager.close()
    stats = manager.stats()
    assert stats.saves_committed == 1 and stats.startup_seconds > 0
    manager2 = asyncckpt.CheckpointManager(tmp_path, max_to_keep=0)
    manager2.save(2, state())  # no prepare: the save makes its engine
    manager2.close()
    assert manager2.stats().startup_seconds > 0


def test_prepare_still_refuses_bad_input_at_once(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, staging_bytes=4096, chunk_bytes=1 << 20)
    with pytest.raises(ValueError, match="staging_bytes"):
        manager.prepare(state())
    manager.close()


def saved(tmp_path):
    with asyncckpt.CheckpointManager(tmp_path) as manager:
        manager.save(5, state())


def test_a_training_jobs_manager_prepares_staging_like_the_latest_checkpoint(tmp_path):
    saved(tmp_path)
    manager = asyncckpt.CheckpointManager(tmp_path, save_interval_steps=10)
    manager.wait_until_finished()  # the preparation the constructor started, and only that
    startup = manager.stats().startup_seconds
    assert startup > 0, "the resuming manager prepared nothing"
    restored = {key: np.zeros_like(value) for key, value in state().items()}
    assert manager.restore(restored) == 5
    manager.save(10, restored)
    manager.close()
    assert manager.stats().startup_seconds == startup  # the save found its engine made


def test_staging_prepared_like_a_smaller_checkpoint_is_remade_for_a_larger_state(tmp_path):
    saved(tmp_path)
    manager = asyncckpt.CheckpointManager(tmp_path, save_interval_steps=10)
    manager.wait_until_finished()
    startup = manager.stats().startup_seconds
    grown = {**state(), "extra": np.ones(1 << 20, dtype=np.float32)}
    manager.save(10, grown)
    manager.close()
    assert manager.stats().startup_seconds > startup  # staging re-sized for the larger state
    restored = {key: np.zeros_like(value) for key, value in grown.items()}
    assert asyncckpt.CheckpointManager(tmp_path).restore(restored) == 10
    assert all(np.array_equal(restored[key], grown[key]) for key in grown)


@pytest.mark.parametrize("manager_options", [
    {},  # no schedule: an evaluation, which takes no lock
    {"save_interval_steps": 10, "asynchronous": False},  # no staging to prepare
])
def test_other_managers_prepare_nothing(tmp_path, manager_options):
    saved(tmp_path)
    manager = asyncckpt.CheckpointManager(tmp_path, **manager_options)
    restored = {key: np.zeros_like(value) for key, value in state().items()}
    assert manager.restore(restored) == 5
    manager.wait_until_finished()
    assert manager.stats().startup_seconds == 0
    manager.close()


def test_a_fresh_directory_prepares_nothing_and_takes_no_lock(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, save_interval_steps=10)
    with asyncckpt.CheckpointManager(tmp_path) as other:
        other.save(1, state())  # the lock is free: the first manager took none
    manager.wait_until_finished()
    assert manager.stats().startup_seconds == 0
    manager.close()


def test_a_resume_beside_a_job_holding_the_directory_logs_and_restores(tmp_path, caplog):
    saved(tmp_path)
    with asyncckpt.CheckpointManager(tmp_path) as holder:
        holder.save(6, state())  # takes the directory's lock
        holder.wait_until_finished()
        with caplog.at_level(logging.WARNING, logger="asyncckpt"):
            manager = asyncckpt.CheckpointManager(tmp_path, save_interval_steps=10)
        assert "could not prepare staging for a resume" in caplog.text
        restored = {key: np.zeros_like(value) for key, value in state().items()}
        assert manager.restore(restored) == 6
        manager.close()
