"""The real training job: examples/pytorch_train.py killed with SIGKILL again and again, restarted
each time, ends with the model, optimizer and learning-rate schedule of an uninterrupted run, bit
for bit, and the same accuracy; every resume is from a multiple of --save-interval-steps."""

import json
import random
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import SOURCE_DIR, run_and_kill

EXAMPLE = SOURCE_DIR / "examples" / "pytorch_train.py"
STEPS = 400
KILLS = 6
SAVE_STEPS = 10


def command(checkpoint_dir, *extra):
    return [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(checkpoint_dir),
            "--steps", str(STEPS), "--save-interval-steps", str(SAVE_STEPS), "--eval-every", "100", *extra]


def finish(checkpoint_dir, digest_file):
    done = subprocess.run(command(checkpoint_dir, "--digest-file", str(digest_file)),
                          check=True, capture_output=True, text=True)
    return json.loads(digest_file.read_text()), done.stdout


def test_a_job_killed_at_random_steps_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    expected, _ = finish(tmp_path / "uninterrupted", tmp_path / "uninterrupted.json")

    rng = random.Random(20240610)
    resumes = []
    for _ in range(KILLS):
        resumes.append(run_and_kill(command(tmp_path / "killed", "--progress"),
                                    rng.randint(5, STEPS // (KILLS + 1))))
    got, output = finish(tmp_path / "killed", tmp_path / "killed.json")
    print(f"killed runs resumed from steps {resumes}")

    assert any(step > 0 for step in resumes), f"no run resumed from a checkpoint: {resumes}"
    assert all(step % SAVE_STEPS == 0 for step in resumes), resumes
    assert "resumed from step" in output
    assert got["accuracy"] == expected["accuracy"]
    differing = sorted(name for name in expected["digests"]
                       if got["digests"].get(name) != expected["digests"][name])
    assert not differing, f"resumes at {resumes}; tensors that differ: {differing}"
    assert got["digests"].keys() == expected["digests"].keys()
    assert expected["accuracy"] > 0.9, "the network did not learn the synthetic digits"
