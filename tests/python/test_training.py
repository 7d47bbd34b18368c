"""Restoring model.state_dict() and optimizer.state_dict() into a freshly built model and
optimizer gives bit-identical training afterwards."""

import hashlib

import pytest

torch = pytest.importorskip("torch")
import asyncckpt


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    return model, optimizer


def train(model, optimizer, steps, first_step):
    model.train()
    for step in range(first_step, first_step + steps):
        data = torch.Generator().manual_seed(step)
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def digest(model, optimizer):
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for index, entry in sorted(optimizer.state_dict()["state"].items()):
        for name, tensor in sorted(entry.items()):
            h.update(f"{index}/{name}".encode())
            h.update(tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    h.update(repr(optimizer.state_dict()["param_groups"]).encode())
    return h.hexdigest()


def state_of(model, optimizer):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state()}


@pytest.fixture(autouse=True)
def deterministic():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("asynchronous", [True, False])
def test_training_after_a_restore_into_fresh_objects_is_bit_identical(ckpt_dir, asynchronous):
    # Uninterrupted: 20 steps, then 15 more.
    model, optimizer = build(seed=1)
    train(model, optimizer, 20, first_step=1)
    with asyncckpt.CheckpointManager(ckpt_dir, asynchronous=asynchronous) as manager:
        manager.save(20, state_of(model, optimizer))
    train(model, optimizer, 15, first_step=21)
    expected = digest(model, optimizer)

    # Fresh objects, built from another seed, restored from step 20.
    model, optimizer = build(seed=99)
    state = state_of(model, optimizer)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(state) == 20
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    train(model, optimizer, 15, first_step=21)
    assert digest(model, optimizer) == expected


def test_the_model_is_restored_in_place_through_its_state_dict(ckpt_dir):
    model, optimizer = build(seed=1)
    train(model, optimizer, 3, first_step=1)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(3, {"model": model.state_dict()})
    fresh, _ = build(seed=2)
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.restore({"model": fresh.state_dict()})  # no load_state_dict needed
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
