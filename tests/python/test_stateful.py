"""Stateful objects (modules, optimizers, schedulers, a user's class) as leaves, as DCP treats
them; values kept with pickle only when allowed on both sides; tied tensors stored once."""

import collections
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import asyncckpt


class Counter:
    """A user's stateful object."""

    def __init__(self):
        self.count = 0
        self.history = []

    def state_dict(self):
        return {"count": self.count, "history": list(self.history)}

    def load_state_dict(self, state):
        self.count = state["count"]
        self.history = list(state["history"])


def make_job(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps):
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def test_module_optimizer_scheduler_and_a_user_object_restore_through_load_state_dict(ckpt_dir):
    model, optimizer, scheduler = make_job(0)
    counter = Counter()
    train(model, optimizer, scheduler, 3)
    counter.count, counter.history = 3, [1, 2, 3]
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
             "counter": counter, "step": 3}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(3, state)

    model2, optimizer2, scheduler2 = make_job(1)
    counter2 = Counter()
    fresh = {"model": model2, "optimizer": optimizer2, "scheduler": scheduler2,
             "counter": counter2, "step": 0}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(fresh) == 3
    # The objects stay in place; their state came through load_state_dict.
    assert fresh["model"] is model2 and fresh["optimizer"] is optimizer2
    assert fresh["step"] == 3 and counter2.count == 3 and counter2.history == [1, 2, 3]
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    assert scheduler2.state_dict() == scheduler.state_dict()
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    # The optimizer restored its moments: both go on bit for bit alike.
    torch.manual_seed(5)
    train(model, optimizer, scheduler, 2)
    torch.manual_seed(5)
    train(model2, optimizer2, scheduler2, 2)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)

    loaded = asyncckpt.load(ckpt_dir)
    assert loaded["counter"] == {"count": 3, "history": [1, 2, 3]}
    assert set(loaded["optimizer"]) == {"state", "param_groups"}


def test_one_cycle_lr_resumes_its_schedule(ckpt_dir):
    _, optimizer, _ = make_job(0)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=20)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(4, {"scheduler": scheduler})
    _, optimizer2, _ = make_job(0)
    scheduler2 = torch.optim.lr_scheduler.OneCycleLR(optimizer2, max_lr=0.1, total_steps=20)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore({"scheduler": scheduler2})
    assert scheduler2.last_epoch == 4
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    optimizer2.step()
    scheduler2.step()
    optimizer.step()
    scheduler.step()
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


class KeepsItsAnnealFunction:
    """A state dict that holds a method bound to its own object, as torch < 2.2's OneCycleLR
    kept ``anneal_func`` (its state dict is its __dict__, and load_state_dict updates that)."""

    def __init__(self):
        self.anneal_func = self._linear
        self.last_epoch = 0

    def _linear(self, start, end, pct):
        return start + (end - start) * pct

    def state_dict(self):
        return dict(vars(self))

    def load_state_dict(self, state):
        self.__dict__.update(state)


def test_a_method_bound_to_its_own_object_is_left_out_of_the_state(ckpt_dir):
    scheduler = KeepsItsAnnealFunction()
    scheduler.last_epoch = 4
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(4, {"scheduler": scheduler})
    assert asyncckpt.load(ckpt_dir) == {"scheduler": {"last_epoch": 4}}
    fresh = KeepsItsAnnealFunction()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore({"scheduler": fresh})
    assert fresh.last_epoch == 4
    assert fresh.anneal_func.__self__ is fresh  # the constructor's, not the saved object's


def test_a_failed_restore_puts_the_objects_back(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"counter": Counter(), "w": torch.zeros(2)})
    counter = Counter()
    state = {"counter": counter, "w": torch.zeros(3)}  # the wrong shape
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, pytest.raises(ValueError, match="'w'"):
        manager.restore(state)
    assert state["counter"] is counter


class Opaque:
    """A value with no exact stored form."""

    def __init__(self, payload):
        self.payload = payload

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.payload == self.payload


def test_pickle_is_used_only_when_allowed_on_both_sides(ckpt_dir):
    state = {"opaque": Opaque({"a": 1}), "fn": os.path.join, "w": np.ones(2)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        with pytest.raises(TypeError, match="allow_pickle=True"):
            manager.save(1, state)
        assert not [name for name in os.listdir(ckpt_dir) if name.startswith("model.ckpt-")]
        manager.save(1, state, allow_pickle=True)
    with pytest.raises(ValueError, match="pickled value at 'opaque'.*allow_pickle=True"):
        asyncckpt.load(ckpt_dir)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager, \
            pytest.raises(ValueError, match="pickled value"):
        manager.restore({"opaque": None, "fn": None, "w": np.zeros(2)})
    loaded = asyncckpt.load(ckpt_dir, allow_pickle=True)
    assert loaded["opaque"] == Opaque({"a": 1}) and loaded["fn"] is os.path.join
    fresh = {"opaque": None, "fn": None, "w": np.zeros(2)}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(fresh, allow_pickle=True)
    assert fresh["opaque"] == Opaque({"a": 1})


class Tied(torch.nn.Module):
    """An embedding whose output layer is the same weight."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight


def test_tied_tensors_are_stored_once_and_load_tied_again(ckpt_dir):
    model = Tied()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"model": model.state_dict()})
        manager.wait_until_finished()
        reader = manager._core.open(1)
        names = [name for name, *_ in reader.tensors()]
        del reader
    assert names == ["model/embed.weight"]
    loaded = asyncckpt.load(ckpt_dir)["model"]
    assert loaded["out.weight"] is loaded["embed.weight"]
    assert torch.equal(loaded["embed.weight"], model.embed.weight.detach())
    assert isinstance(loaded, collections.OrderedDict)
    # restore into a fresh tied model and into one whose copies are not tied
    fresh = Tied()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore({"model": fresh})
    assert fresh.out.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    untied = {"model": {"embed.weight": torch.zeros(50, 16), "out.weight": torch.zeros(50, 16)}}
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore(untied)
    assert torch.equal(untied["model"]["out.weight"], model.embed.weight.detach())


def test_numpy_views_of_one_array_are_stored_once(ckpt_dir):
    a = np.arange(6, dtype=np.float64)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, [a, a, a[:3]])
    loaded = asyncckpt.load(ckpt_dir)
    assert loaded[0] is loaded[1] and np.array_equal(loaded[2], a[:3])


def test_the_library_logs_through_python_logging(ckpt_dir, caplog, capfd):
    caplog.set_level(logging.INFO, logger="asyncckpt")
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=1) as manager:
        manager.save(1, {"w": np.ones(2)})
        manager.save(2, {"w": np.ones(2)})
        manager.wait_until_finished()
    removed = [r for r in caplog.records if "retention removed" in r.getMessage()]
    assert removed and removed[0].name == "asyncckpt" and removed[0].levelno == logging.INFO
    assert "retention removed" not in capfd.readouterr().err  # not printed by C++ any more
    (ckpt_dir / "model.ckpt-3.tmp-0123456789abcdef").mkdir()
    caplog.clear()
    with asyncckpt.CheckpointManager(ckpt_dir, max_to_keep=1) as manager:
        manager.save(4, {"w": np.ones(2)})  # the start-up clean-up runs at the first save
    assert any(r.levelno == logging.INFO and r.getMessage().startswith("removed ")
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_quarantined_checkpoint_is_an_error_record_without_a_prefix_of_its_own(ckpt_dir,
                                                                               caplog):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": np.ones(2)})
    (ckpt_dir / "model.ckpt-1" / "index").write_bytes(b"not an index")
    caplog.set_level(logging.ERROR, logger="asyncckpt")  # what a user keeps to see problems
    with asyncckpt.CheckpointManager(ckpt_dir, allow_fresh_start=True) as manager:
        manager.save(2, {"w": np.ones(2)})  # the start-up pass quarantines at the first save
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    message = errors[0].getMessage()
    assert "model.ckpt-1" in message and "quarantined" in message
    assert not message.startswith(("ERROR", "WARNING")), message
