"""One rank of test_torchrun_dcp.py's jobs, started by torchrun: FSDP2 state through
torch.distributed.checkpoint with asyncckpt's StorageWriter, StorageReader and Stager.

    torchrun --standalone --nproc_per_node N torchrun_dcp_worker.py MODE DIR

MODE save: two training steps of a small FSDP2 model with AdamW, then dcp.save (or, with
MODE async_save, dcp.async_save with asyncckpt's Stager); rank 0 keeps the full tensors in
DIR/expected.pt. MODE load: a fresh model, dcp.load, and a comparison with DIR/expected.pt.
MODE plain_load (one process, no process group): dcp.load into a plain model's state dict.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import asyncckpt.torch


def build(seed: int, mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 5, dtype=torch.bfloat16).float())
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for step in range(2):
        torch.manual_seed(100 + step)
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def full(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: full(item) for key, item in value.items()}
    if isinstance(value, list):
        return [full(item) for item in value]
    if hasattr(value, "full_tensor"):
        return value.full_tensor()
    return value


def same(left: Any, right: Any, where: str = "") -> list[str]:
    if isinstance(left, dict):
        if set(left) != set(right):
            return [f"{where}: keys {sorted(map(str, left))} != {sorted(map(str, right))}"]
        return [d for key in left for d in same(left[key], right[key], f"{where}.{key}")]
    if isinstance(left, list):
        return [d for i, (a, b) in enumerate(zip(left, right)) for d in same(a, b, f"{where}[{i}]")]
    if isinstance(left, torch.Tensor):
        return [] if torch.equal(left, right) else [f"{where}: tensors differ"]
    return [] if left == right else [f"{where}: {left!r} != {right!r}"]


def report(*words: object) -> None:
    """One line in one write, so that the ranks' lines do not interleave."""
    os.write(1, (" ".join(map(str, words)) + "\n").encode())


def main(mode: str, directory: str) -> None:
    if mode == "plain_load":
        model, _ = build(seed=7, mesh=None)
        state = {"model": model.state_dict()}
        dcp.load(state, storage_reader=asyncckpt.torch.StorageReader(directory))
        expected = torch.load(f"{directory}/expected.pt")
        differences = same(expected["model"], state["model"], "model")
        report("plain_load", "bit-exact" if not differences else differences)
        return
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    if mode in ("save", "async_save"):
        model, optimizer = build(seed=0, mesh=mesh)
        train(model, optimizer)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "step": 2}
        writer = asyncckpt.torch.StorageWriter(directory)
        if mode == "save":
            dcp.save(state, storage_writer=writer)
        else:
            stager = asyncckpt.torch.Stager()
            dcp.async_save(state, storage_writer=writer, async_stager=stager).result()
            stager.close()
        expected = full({"model": model_state, "optimizer": optimizer_state})
        if rank == 0:
            torch.save(expected, f"{directory}/expected.pt")
        report(rank, mode, "done")
    elif mode == "load":
        model, optimizer = build(seed=1, mesh=mesh)
        train(model, optimizer)  # optimizer state to load into
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "step": 0}
        dcp.load(state, storage_reader=asyncckpt.torch.StorageReader(directory))
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        expected = torch.load(f"{directory}/expected.pt")
        loaded = full(dict(zip(("model", "optimizer"), get_state_dict(model, optimizer))))
        differences = same(expected, loaded) + ([] if state["step"] == 2 else ["step"])
        report(rank, "load", "bit-exact" if not differences else differences)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
