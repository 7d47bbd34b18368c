"""restore(template) reads what the template names and nothing else: a subset of a checkpoint
reads in proportion to the subset, the caller's dict gets no keys it did not ask for, and a
template key the checkpoint lacks is refused, naming it, unless partial=True."""

import numpy as np
import pytest

import asyncckpt
from asyncckpt import _core
from asyncckpt import manager as manager_module

torch = pytest.importorskip("torch")


def saved_state():
    """A model, an optimizer's moments and metrics: 10% of the bytes are the model's."""
    return {"model": {"w": torch.full((256, 64), 1.0), "b": torch.full((64,), 2.0)},
            "optimizer": {"m": torch.full((256, 64 * 9), 3.0), "step": 40},
            "metrics": {"loss": 0.25}}


def bytes_of(tree):
    if isinstance(tree, dict):
        return sum(bytes_of(value) for value in tree.values())
    return tree.numel() * tree.element_size() if isinstance(tree, torch.Tensor) else 0


def restore_counting(path, template, **kwargs):
    """The manager's restore path on a reader of ``path``, and what that reader read."""
    reader = _core.open_reader(path, force_posix_io=True)
    manager_module._restore_from(reader, template, **kwargs)
    return reader.read_stats()


@pytest.fixture
def checkpoint(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir, compression="none") as manager:
        manager.save(1, saved_state())
        return manager.checkpoint_path(1)


def test_a_subset_restore_reads_in_proportion_to_the_subset(checkpoint):
    full = restore_counting(checkpoint, {k: v for k, v in saved_state().items()})
    subset = {"model": {"w": torch.zeros(256, 64), "b": torch.zeros(64)}}
    read = restore_counting(checkpoint, subset)
    share = bytes_of(subset) / bytes_of(saved_state())
    assert full["bytes_read"] >= bytes_of(saved_state())
    assert read["bytes_read"] <= 1.5 * share * full["bytes_read"], (read, full)
    assert torch.equal(subset["model"]["w"], torch.ones(256, 64))


def test_a_subset_restore_adds_no_keys_to_the_callers_dict(ckpt_dir, checkpoint):
    state = {"model": {"w": torch.zeros(256, 64), "b": torch.zeros(64)}}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state) == 1
    assert list(state) == ["model"] and sorted(state["model"]) == ["b", "w"]
    assert torch.equal(state["model"]["b"], torch.full((64,), 2.0))


def test_a_module_alone_restores_from_a_checkpoint_with_its_optimizer(ckpt_dir):
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(3, {"model": model, "optimizer": optimizer, "step": 3})
    fresh = torch.nn.Linear(8, 4)
    state = {"model": fresh}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state) == 3
    assert list(state) == ["model"] and state["model"] is fresh
    assert torch.equal(fresh.weight, model.weight)


def test_template_keys_the_checkpoint_lacks_are_refused_naming_each_and_change_nothing(
        ckpt_dir, checkpoint):
    state = {"model": {"w": torch.zeros(256, 64), "b": torch.zeros(64),
                       "new_layer": torch.zeros(3)},
             "ema": torch.zeros(2)}
    refusal = (r"'ema', 'model/new_layer' are in the given state but not in the checkpoint "
               r".*partial=True")
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, \
            pytest.raises(ValueError, match=refusal):
        manager.restore(state)
    assert torch.equal(state["model"]["w"], torch.zeros(256, 64)), "changed before the refusal"


def test_partial_true_restores_what_the_checkpoint_has_and_leaves_the_rest(ckpt_dir, checkpoint):
    state = {"model": {"w": torch.zeros(256, 64), "new_layer": torch.full((3,), 7.0)}}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state, partial=True) == 1
    assert torch.equal(state["model"]["w"], torch.ones(256, 64))
    assert torch.equal(state["model"]["new_layer"], torch.full((3,), 7.0))
    assert sorted(state["model"]) == ["new_layer", "w"]


def test_a_subset_of_a_numpy_checkpoint_written_without_the_python_layer_is_by_name(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(2, {"a": np.arange(6.0), "b": np.ones(4)})
    state = {"a": np.zeros(6)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state) == 2
    np.testing.assert_array_equal(state["a"], np.arange(6.0))
    assert list(state) == ["a"]
