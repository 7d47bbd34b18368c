"""CheckpointManager.prepare: the engine and pinned staging exist before the first save, which
then costs what a later save costs, and the start-up cost is reported on its own."""

import numpy as np

import asyncckpt


def state():
    return {"w": np.arange(1 << 18, dtype=np.float32), "b": np.ones(64, dtype=np.float64)}


def test_prepare_pays_the_start_up_before_the_first_save(tmp_path):
    manager = asyncckpt.CheckpointManager(tmp_path, max_to_keep=0)
    manager.prepare(state(), reserve_bytes=4 << 20)
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
