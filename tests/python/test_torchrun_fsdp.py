# ctest-labels: torchrun
"""examples/fsdp_train.py under torchrun (FSDP2 over gloo on CPU) with asyncckpt's manager: a job
SIGKILLed at random moments, one rank or the whole job, resumes each time from its last durable
checkpoint and ends bit-exact against an uninterrupted run; a job resumed on 4, then 2, then 3
ranks restores exactly the state the run before it saved.

ASYNCCKPT_TORCHRUN_KILLS sets the number of kills (4 here; test_torchrun_fsdp_soak runs 24)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR

EXAMPLE = SOURCE_DIR / "examples" / "fsdp_train.py"


def torchrun_command(ranks: int, checkpoint_dir, *extra: str) -> list[str]:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed beside this Python")
    return [torchrun, "--standalone", "--nproc_per_node", str(ranks), str(EXAMPLE),
            "--checkpoint-dir", str(checkpoint_dir), *extra]


def environment() -> dict[str, str]:
    return dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


def run(ranks: int, checkpoint_dir, digest_file, *extra: str) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        torchrun_command(ranks, checkpoint_dir, "--digest-file", str(digest_file), *extra),
        check=False, capture_output=True, text=True, timeout=600, env=environment())
    if done.returncode != 0 and "gloo" in done.stderr and "Connection" in done.stderr:
        pytest.skip(f"gloo cannot start here: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    with open(digest_file) as digests:
        return json.load(digests)


def run_and_kill(checkpoint_dir, steps: int, kill_rank: bool, kill_at_step: int | None) -> bool:
    """Starts the job and SIGKILLs one rank or the whole job once rank 0 has printed step
    ``kill_at_step`` (None: as soon as the ranks are up). False when the job ended first."""
    process = subprocess.Popen(
        torchrun_command(2, checkpoint_dir, "--steps", str(steps), "--progress"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment(),
        start_new_session=True)
    assert process.stdout is not None
    pids: dict[int, int] = {}
    killed = False
    for line in process.stdout:
        words = line.split()
        if words[:1] == ["pid"]:
            pids[int(words[1])] = int(words[2])
        ready = len(pids) == 2 and (kill_at_step is None or
                                    (words[:1] == ["step"] and int(words[1]) >= kill_at_step))
        if ready:
            if kill_rank:
                os.kill(pids[1], signal.SIGKILL)  # torchrun then stops the other rank
            else:
                os.killpg(process.pid, signal.SIGKILL)
            killed = True
            break
    process.stdout.close()
    process.wait(timeout=120)
    if not killed:
        assert process.returncode == 0
    return killed


def latest_step(checkpoint_dir) -> int:
    state_file = checkpoint_dir / "checkpoint"
    if not state_file.exists():
        return 0
    first = state_file.read_text().splitlines()[0]
    return int(first.rsplit("-", 1)[1].rstrip('"'))


def kill_and_resume(tmp_path, kills: int) -> None:
    steps = max(40, 4 * kills)  # room for every kill: a kill before a save loses its steps
    reference = run(2, tmp_path / "reference", tmp_path / "reference.json", "--steps", str(steps))
    checkpoint_dir = tmp_path / "killed"
    chooser = random.Random(int(os.environ.get("ASYNCCKPT_TEST_SEED", "0")) + kills)
    done_kills = 0
    while done_kills < kills:
        start = latest_step(checkpoint_dir)
        # A quarter of the kills land while the ranks start up or restore, the rest mid-training.
        kill_at = None if chooser.random() < 0.25 else min(steps - 1,
                                                             start + chooser.randint(1, 8))
        if run_and_kill(checkpoint_dir, steps, kill_rank=done_kills % 2 == 1, kill_at_step=kill_at):
            done_kills += 1
        else:
            break  # the job finished before its kill: nothing left to interrupt
        # Every kill leaves the checkpoint directory one a new job restores from.
        assert latest_step(checkpoint_dir) >= start
    assert done_kills == kills, f"the job finished after {done_kills} of {kills} kills"
    resumed = run(2, checkpoint_dir, tmp_path / "resumed.json", "--steps", str(steps))
    assert resumed["final"] == reference["final"]


def test_a_job_killed_at_random_moments_resumes_bit_exact(tmp_path):
    kill_and_resume(tmp_path, int(os.environ.get("ASYNCCKPT_TORCHRUN_KILLS", "4")))


def test_a_job_resumed_on_4_then_2_then_3_ranks_restores_what_the_last_run_saved(tmp_path):
    checkpoint_dir = tmp_path / "ckpt"
    common = ("--batch-size", "12", "--save-interval-steps", "4")
    on_4 = run(4, checkpoint_dir, tmp_path / "4.json", "--steps", "8", *common)
    on_2 = run(2, checkpoint_dir, tmp_path / "2.json", "--steps", "12", *common)
    on_3 = run(3, checkpoint_dir, tmp_path / "3.json", "--steps", "16", *common)
    assert on_2["restored"] == on_4["final"]
    assert on_3["restored"] == on_2["final"]
    assert on_3["final"]["step"] == 16
