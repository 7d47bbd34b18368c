"""One "latest" everywhere (issue 32 item 1): the step the last successful save wrote, as the
state file records it. The manager, a new manager, latest_checkpoint(), asyncckpt.load(dir),
the CLI's `latest` and all_steps() (in save order) agree after any sequence of saves, forced
lower ones included, and the "lower than the latest" rule compares with that same step. A
property test drives random sequences of save, forced save, close and reopen."""

import random
import subprocess

import numpy as np
import pytest

import asyncckpt
from conftest import BUILD_DIR

MAX_TO_KEEP = 3


def state(step):
    return {"w": np.full(16, step, dtype=np.int64), "step": step}


def test_a_forced_lower_step_is_the_latest_for_every_entry_point(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(5, state(5))
        manager.save(7, state(7))
        manager.save(6, state(6), force=True)
        manager.wait_until_finished()
        assert manager.latest_step() == 6 and manager.all_steps() == [5, 7, 6]
    reopened = asyncckpt.CheckpointManager(ckpt_dir)
    assert reopened.latest_step() == 6  # was 7: a crash after a rollback resumed the step before
    assert reopened.restore(state(0)) == 6
    assert asyncckpt.load(ckpt_dir)["step"] == 6
    assert asyncckpt.latest_checkpoint(ckpt_dir).endswith("model.ckpt-6")
    reopened.save(7, state(70))  # the rolled-back timeline goes on past 6
    reopened.close()
    assert asyncckpt.load(ckpt_dir)["step"] == 70


class Model:
    """What every entry point must say: the retained steps in save order, the last the latest."""

    def __init__(self):
        self.steps = []

    def saved(self, step):
        if step in self.steps:
            self.steps.remove(step)
        self.steps.append(step)
        del self.steps[:-MAX_TO_KEEP]

    @property
    def latest(self):
        return self.steps[-1] if self.steps else None


def cli_latest(directory):
    cli = BUILD_DIR / "bin" / "asyncckpt"
    if not cli.exists():
        return None
    done = subprocess.run([str(cli), "latest", str(directory)], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def check_every_entry_point(directory, manager, model):
    assert manager.latest_step() == model.latest
    assert manager.all_steps() == model.steps
    other = asyncckpt.CheckpointManager(directory, max_to_keep=MAX_TO_KEEP)  # reads only
    try:
        assert other.latest_step() == model.latest
        assert other.all_steps() == model.steps
    finally:
        other.close()
    if model.latest is None:
        assert asyncckpt.latest_checkpoint(directory) is None
        return
    name = f"model.ckpt-{model.latest}"
    assert asyncckpt.latest_checkpoint(directory).endswith(name)
    assert asyncckpt.load(directory)["step"] == model.latest
    cli = cli_latest(directory)
    assert cli is None or cli.endswith(name)
    # The rule for the next save compares with the same step.
    with pytest.raises(asyncckpt.StepAlreadyExistsError):
        manager.save(model.latest, state(model.latest))
    if model.latest > 0:
        with pytest.raises(asyncckpt.StepAlreadyExistsError,
                           match=f"lower than the latest saved step {model.latest}"):
            manager.save(model.latest - 1, state(model.latest - 1))


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_of_saves_forced_saves_and_reopens_agree_everywhere(ckpt_dir, seed):
    rng = random.Random(seed)
    model = Model()
    manager = asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=MAX_TO_KEEP)
    highest = -1
    try:
        for _ in range(18):
            action = rng.choice(["save", "save", "forced", "reopen"])
            if action == "reopen":
                manager.close()
                manager = asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=MAX_TO_KEEP)
            elif action == "save" or model.latest is None:
                step = (model.latest if model.latest is not None else -1) + rng.randint(1, 3)
                manager.save(step, state(step))
                model.saved(step)
            else:
                step = rng.randint(max(0, highest - 4), highest)  # a rollback, or a re-save
                manager.save(step, state(step), force=True)
                model.saved(step)
            highest = max([highest, *model.steps])
            manager.wait_until_finished()
            check_every_entry_point(ckpt_dir, manager, model)
    finally:
        manager.close()
