"""The JAX training job: examples/jax_train.py (an MLP sharded over a Mesh of 8 CPU devices,
hand-written Adam, its data iterator checkpointed beside it) killed with SIGKILL ten times at
random steps and restarted each time ends bit for bit where an uninterrupted run ends; its
checkpoint restores onto a mesh of 4 devices bit for bit and trains on from there."""

import json
import random
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from conftest import SOURCE_DIR, run_and_kill

EXAMPLE = SOURCE_DIR / "examples" / "jax_train.py"
STEPS = 300
KILLS = 10
SAVE_STEPS = 10


def command(checkpoint_dir, *extra, steps=STEPS):
    return [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(checkpoint_dir),
            "--steps", str(steps), "--save-interval-steps", str(SAVE_STEPS), *extra]


def finish(checkpoint_dir, digest_file, *extra, steps=STEPS):
    done = subprocess.run(command(checkpoint_dir, "--digest-file", str(digest_file), *extra,
                                  steps=steps), check=True, capture_output=True, text=True)
    return json.loads(digest_file.read_text()), done.stdout


def test_a_job_killed_ten_times_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    expected, _ = finish(tmp_path / "uninterrupted", tmp_path / "uninterrupted.json")

    rng = random.Random(20261127)
    # Each run is killed at a random step after its first durable save, so every kill after the
    # first run resumes from a checkpoint however loaded the machine is.
    resumes = [run_and_kill(command(tmp_path / "killed", "--progress"),
                            rng.randint(1, SAVE_STEPS), after="durable ")
               for _ in range(KILLS)]
    got, output = finish(tmp_path / "killed", tmp_path / "killed.json")
    print(f"killed runs resumed from steps {resumes}")

    assert all(step > 0 for step in resumes[1:]), resumes
    assert all(step % SAVE_STEPS == 0 for step in resumes), resumes
    assert "resumed from step" in output
    differing = sorted(name for name in expected["digests"]
                       if got["digests"].get(name) != expected["digests"][name])
    assert not differing, f"resumes at {resumes}; leaves that differ: {differing}"
    assert got == expected
    assert expected["accuracy"] > 0.85, "the MLP did not learn the synthetic task"


def test_a_checkpoint_of_eight_devices_restores_onto_four(tmp_path):
    saved, _ = finish(tmp_path / "ckpt", tmp_path / "eight.json", steps=60)
    restored, output = finish(tmp_path / "ckpt", tmp_path / "four.json", "--devices", "4",
                              steps=60)
    assert "resumed from step 60" in output
    assert restored == saved
    trained, output = finish(tmp_path / "ckpt", tmp_path / "more.json", "--devices", "4",
                             steps=80)
    assert "resumed from step 60" in output and trained["step"] == 80
    assert trained["digests"]["data.position"] == "80"
