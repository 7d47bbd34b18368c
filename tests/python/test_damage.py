"""Damage handled the same way by every entry point (issue 31): a newer release's checkpoint is
not damage, a bad byte falls back to the newest good checkpoint, damage is never reported as
"no checkpoint", and no basename takes another's checkpoints."""

import ctypes
import ctypes.util
import logging
import os
import struct

import numpy as np
import pytest

import asyncckpt


def state(value=1.0, size=4096):
    return {"w": np.full(size, value, dtype=np.float32)}


def save_steps(directory, steps, **options):
    with asyncckpt.CheckpointManager(directory, compression="none", max_to_keep=0,
                                     **options) as manager:
        for step in steps:
            manager.save(step, state(float(step)))


def flip_data_bytes(checkpoint):
    """Bytes flipped inside the first data file: its size is right, its chunks fail the checksum."""
    data = checkpoint / "data-00000-of-00002"
    with open(data, "r+b") as f:
        f.seek(64)
        f.write(b"\xff\xfe\xfd\xfc")


def truncate_data(checkpoint):
    data = checkpoint / "data-00000-of-00002"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def quarantined(directory):
    return sorted(name.split(".corrupt-")[0] for name in os.listdir(directory)
                  if ".corrupt-" in name)


# ---- D2: damage is not absence --------------------------------------------------------------


def test_every_entry_point_says_file_not_found_only_when_there_never_was_a_checkpoint(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state()) is None
        with pytest.raises(FileNotFoundError):
            manager.load()
    with pytest.raises(FileNotFoundError):
        asyncckpt.load(ckpt_dir)
    assert asyncckpt.latest_checkpoint(ckpt_dir) is None


def test_every_entry_point_names_the_damage_when_the_only_checkpoint_is_damaged(ckpt_dir):
    save_steps(ckpt_dir, [3])
    truncate_data(ckpt_dir / "model.ckpt-3")
    manager = asyncckpt.CheckpointManager(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-3"):
        manager.load()  # was FileNotFoundError: "no checkpoint", a fresh start for its caller
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-3"):
        manager.restore(state())
    manager.close()
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-3"):
        asyncckpt.load(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="model.ckpt-3"):
        asyncckpt.latest_checkpoint(ckpt_dir)


# ---- D3: a bad byte falls back ----------------------------------------------------------------


def test_a_bad_byte_in_the_latest_falls_back_to_the_newest_good_one_and_quarantines_it(
        ckpt_dir, caplog):
    save_steps(ckpt_dir, [1, 2, 3])
    flip_data_bytes(ckpt_dir / "model.ckpt-3")
    # Start-up checks sizes only: every entry point still names step 3 until it is read.
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-3")
    with caplog.at_level(logging.ERROR, logger="asyncckpt"):
        loaded = asyncckpt.load(ckpt_dir)  # read-only: falls back, quarantines nothing
    assert np.array_equal(loaded["w"], state(2.0)["w"])
    assert quarantined(ckpt_dir) == []
    manager = asyncckpt.CheckpointManager(ckpt_dir)
    with pytest.raises(asyncckpt.CheckpointError, match="checksum"):
        manager.restore(state(0.0), step=3)  # an exact step fails instead
    into = state(0.0)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="asyncckpt"):
        assert manager.restore(into) == 2
    assert np.array_equal(into["w"], state(2.0)["w"])
    assert quarantined(ckpt_dir) == ["model.ckpt-3"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("model.ckpt-3/data-00000-of-00002: tensor" in line and "chunk" in line
               for line in errors), errors
    assert manager.latest_step() == 2 and manager.all_steps() == [1, 2]
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-2")
    manager.save(3, state(30.0))  # the lost step trains again
    manager.close()
    assert asyncckpt.CheckpointManager(ckpt_dir).latest_step() == 3


def test_load_of_a_manager_falls_back_too(ckpt_dir):
    save_steps(ckpt_dir, [1, 2])
    flip_data_bytes(ckpt_dir / "model.ckpt-2")
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert np.array_equal(manager.load()["w"], state(1.0)["w"])
    assert quarantined(ckpt_dir) == ["model.ckpt-2"]


# ---- D1: a newer release's checkpoint ---------------------------------------------------------


def xxh3_64():
    """XXH3-64 of bytes through the system's libxxhash (the library the engine links), or None."""
    name = ctypes.util.find_library("xxhash")
    if name is None:
        return None
    library = ctypes.CDLL(name)
    library.XXH3_64bits.restype = ctypes.c_uint64
    library.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lambda data: library.XXH3_64bits(data, len(data))


def set_index_flags(checkpoint, flags, checksum):
    """The index's header flags set, its checksum made right: a newer release's checkpoint."""
    index = bytearray((checkpoint / "index").read_bytes())
    index[12:16] = struct.pack("<I", flags)
    index[-16:-8] = struct.pack("<Q", checksum(bytes(index[:-16])))
    (checkpoint / "index").write_bytes(bytes(index))


def test_a_newer_releases_checkpoint_is_refused_everywhere_and_never_quarantined(ckpt_dir):
    checksum = xxh3_64()
    if checksum is None:
        pytest.skip("no libxxhash to reseal the index with")
    save_steps(ckpt_dir, [1, 2])
    set_index_flags(ckpt_dir / "model.ckpt-2", 4, checksum)
    before = sorted(os.listdir(ckpt_dir))
    manager = asyncckpt.CheckpointManager(ckpt_dir)
    for call in (lambda: manager.restore(state()), lambda: manager.load(),
                 lambda: manager.save(3, state()), lambda: asyncckpt.load(ckpt_dir),
                 lambda: asyncckpt.latest_checkpoint(ckpt_dir)):
        with pytest.raises(asyncckpt.CheckpointError, match="newer release"):
            call()
    manager.close()
    assert sorted(os.listdir(ckpt_dir)) == before
    assert quarantined(ckpt_dir) == []


# ---- D4 and D10: basenames ----------------------------------------------------------------------


def test_a_basename_another_state_file_lists_is_refused_naming_both(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, basename="input.ckpt") as owner:
        owner.save(1, state())
    # Its state file is "checkpoint"; move it to where train-sim's input pipeline keeps it.
    os.rename(ckpt_dir / "checkpoint", ckpt_dir / "checkpoint_input")
    before = sorted(os.listdir(ckpt_dir))
    with pytest.raises(asyncckpt.CheckpointError,
                       match=r"checkpoint'? belongs to state file .*checkpoint_input"):
        asyncckpt.CheckpointManager(ckpt_dir, basename="input.ckpt", max_to_keep=1)
    assert sorted(os.listdir(ckpt_dir)) == before


def test_an_empty_basename_is_refused(ckpt_dir):
    with pytest.raises(ValueError, match="basename must not be empty"):
        asyncckpt.CheckpointManager(ckpt_dir, basename="")
    assert os.listdir(ckpt_dir) == []


# ---- D6: latest names what a resume uses ----------------------------------------------------------


def test_latest_passes_over_a_damaged_latest_as_a_resume_does(ckpt_dir):
    save_steps(ckpt_dir, [1, 2])
    truncate_data(ckpt_dir / "model.ckpt-2")
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-1")
    assert np.array_equal(asyncckpt.load(ckpt_dir)["w"], state(1.0)["w"])
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.latest_step() == 1
        into = state(0.0)
        assert manager.restore(into) == 1


def test_latest_finds_the_checkpoint_whose_state_file_write_failed(ckpt_dir):
    save_steps(ckpt_dir, [1])
    os.remove(ckpt_dir / "checkpoint")  # the first commit's state-file write failed (disk full)
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-1")
    assert asyncckpt.CheckpointManager(ckpt_dir).latest_step() == 1
