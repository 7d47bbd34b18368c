# ctest-labels: torchrun
"""asyncckpt.torch.Stager's stream-ordered mode: it refuses to run without a GPU, and with one
its async_save hands DCP a future, returns before the GPU copies are done, and saves the state
as it was when staged although the optimizer updates it right after (the update waits for the
copies on the GPU). The GPU tests skip where torch sees no GPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import asyncckpt.torch as ackpt_torch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP without a process group

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_stream_ordered_staging_without_a_gpu_is_refused_naming_it():
    with pytest.raises(RuntimeError, match=r"Stager\(cuda_stream_ordered=True\) needs a CUDA GPU"):
        ackpt_torch.Stager(cuda_stream_ordered=True)


def test_the_default_stager_stages_cpu_tensors_at_once():
    stager = ackpt_torch.Stager()
    source = {"w": torch.arange(12.0)}
    staged = stager.stage(source)
    source["w"].add_(1)
    assert isinstance(staged, dict) and torch.equal(staged["w"], torch.arange(12.0))
    stager.close()


@needs_gpu
@pytest.mark.parametrize("hooked", [True, False])
def test_stream_ordered_async_save_keeps_the_state_as_staged(ckpt_dir, hooked):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    stager = ackpt_torch.Stager(cuda_stream_ordered=True)
    handle = stager.wait_before_update(optimizer) if hooked else None
    model(torch.randn(8, 256, device="cuda")).sum().backward()
    before = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    response = dcp.async_save(dict(model.named_parameters()),
                              storage_writer=ackpt_torch.StorageWriter(ckpt_dir),
                              async_stager=stager)
    optimizer.step()  # the update waits for the copies: on the GPU, through the hook or stage()
    response.staging_completion.result()
    response.upload_completion.result()
    if handle is not None:
        handle.remove()
    stager.close()
    loaded = {name: torch.zeros_like(value) for name, value in before.items()}
    dcp.load(loaded, storage_reader=ackpt_torch.StorageReader(ckpt_dir))
    for name, value in before.items():
        assert torch.equal(loaded[name], value), name
        assert not torch.equal(dict(model.named_parameters())[name].detach().cpu(), value)
