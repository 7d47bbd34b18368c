"""Stream-ordered saves of CUDA tensors from Python: the optimizer step pre-hook that makes only
the update wait for the snapshot copies, the clear error without a GPU, and (on a GPU) a save
whose copy overlaps the next forward and backward and still holds the bytes before the update."""

import numpy as np
import pytest

import asyncckpt

torch = pytest.importorskip("torch")


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


def train_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.randn(16, 8)).square().mean().backward()
    optimizer.step()


def test_the_hook_waits_before_every_step_until_removed(ckpt_dir, monkeypatch):
    model, optimizer = model_and_optimizer()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        waits = []
        real_wait = manager.wait_for_snapshot_copies

        def counting_wait():
            # The update has not run yet: the parameters are still those of the last step.
            waits.append(model.weight.detach().clone())
            real_wait()

        monkeypatch.setattr(manager, "wait_for_snapshot_copies", counting_wait)
        handle = manager.wait_before_update(optimizer)
        before = model.weight.detach().clone()
        train_step(model, optimizer)
        manager.save(1, {"model": model})
        train_step(model, optimizer)
        assert len(waits) == 2  # one per step; none inside the save, which the hook defers
        assert torch.equal(waits[0], before)
        assert not torch.equal(model.weight, before)  # the update still ran
        handle.remove()
        handle.remove()  # idempotent
        train_step(model, optimizer)
        assert len(waits) == 2
        manager.save(2, {"model": model})
        assert len(waits) == 3  # no hook: the save itself waits (nothing to wait for on a CPU)
    assert torch.equal(asyncckpt.load(ckpt_dir)["model"]["weight"], model.weight.detach())


def test_the_wait_is_a_torch_step_pre_hook_that_remove_takes_off(ckpt_dir, monkeypatch):
    _, optimizer = model_and_optimizer()
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        calls = []
        monkeypatch.setattr(manager, "wait_for_snapshot_copies", lambda: calls.append(1))
        handle = manager.wait_before_update(optimizer)
        # torch runs its step pre-hooks however the step is reached, the class's step included,
        # which a wrapper put on the instance would miss; the instance's step stays torch's.
        assert "step" not in vars(optimizer)
        optimizer.step()
        type(optimizer).step(optimizer)
        assert len(calls) == 2
        handle.remove()
        optimizer.step()
        type(optimizer).step(optimizer)
        assert len(calls) == 2
        assert "step" not in vars(optimizer)


@pytest.mark.skipif(asyncckpt.cuda_available(), reason="checks the error without a GPU")
def test_stream_ordered_without_a_gpu_is_a_clear_error(ckpt_dir):
    with pytest.raises(RuntimeError, match="cuda_stream_ordered=True needs a CUDA GPU"):
        asyncckpt.CheckpointManager(ckpt_dir, cuda_stream_ordered=True)
    assert not list(ckpt_dir.iterdir())  # refused before anything was created


@pytest.mark.skipif(not torch.cuda.is_available() or not asyncckpt.cuda_available(),
                    reason="needs a GPU, a CUDA torch and asyncckpt built with CUDA")
def test_a_stream_ordered_save_holds_the_bytes_before_the_update(ckpt_dir):
    torch.manual_seed(0)
    # Large enough that the copy is still running while forward and backward are queued.
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(256, 4096, device="cuda")
    # A side stream, as torch makes them (non-blocking): the legacy default stream would wait
    # for the device's copy stream anyway, and the test would not see a missing wait.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), \
            asyncckpt.CheckpointManager(ckpt_dir, cuda_stream_ordered=True) as manager:
        handle = manager.wait_before_update(optimizer)
        for step in range(1, 4):
            optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()
            expected = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
            host = torch.full((5,), float(step))  # host tensors pass through as usual
            manager.save(step, {"model": model, "host": host})
            optimizer.zero_grad()
            model(inputs).square().mean().backward()  # overlaps the copy
            optimizer.step()  # the hook orders this update after the copy
            manager.wait_until_finished()
            loaded = asyncckpt.load(manager.checkpoint_path(step))
            assert torch.equal(loaded["host"], host)
            for key, value in expected.items():
                assert np.array_equal(loaded["model"][key].numpy(), value), (step, key)
            assert not np.array_equal(model.state_dict()["0.weight"].cpu().numpy(),
                                      expected["0.weight"])
        handle.remove()
