#!/usr/bin/env python3
"""Trains a small transformer-shaped language model with FSDP2 on every rank of a torchrun job,
checkpointing with asyncckpt's CheckpointManager; run it again with the same --checkpoint-dir,
on the same or another number of ranks, and it resumes from the last durable checkpoint.

    torchrun --standalone --nproc_per_node 2 examples/fsdp_train.py --checkpoint-dir /tmp/fsdp

(from a CMake build tree: PYTHONPATH=build/python .venv/bin/torchrun ...). On CPU it runs over
gloo: each block and the whole model are wrapped with fully_shard on a one-dimensional CPU
device mesh, so parameters and AdamW's moments are DTensors sharded over the ranks. The manager
saves each rank's shards as boxes of the global tensors (a replicated value once), rank 0
commits each step all or nothing, and a restore on another number of ranks reads each rank's
new boxes (resharding).

Deterministic: seeded, and each step's batch is a function of the step alone (the global batch
is split over the ranks), so on the same number of ranks a resumed run ends bit for bit where an
uninterrupted one ends. Saves land on the multiples of --save-interval-steps (Orbax's rule).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import asyncckpt


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where checkpoints go")
    parser.add_argument("--steps", type=int, default=60, help="last global step")
    parser.add_argument("--save-interval-steps", type=int, default=5,
                        help="save at the multiples of N")
    parser.add_argument("--max-to-keep", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--sequence", type=int, default=32, help="tokens per sample")
    parser.add_argument("--batch-size", type=int, default=8, help="global batch")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true",
                        help="print 'step N' (rank 0) and 'pid RANK PID' (every rank)")
    parser.add_argument("--digest-file",
                        help="rank 0 writes the restored step's and the final state's digests "
                             "here (JSON)")
    return parser.parse_args(argv)


class Block(torch.nn.Module):
    """Pre-norm self-attention and MLP, causal."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        attended = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.out(attended)
        return x + self.mlp(self.norm2(x))


class LanguageModel(torch.nn.Module):
    """Token and position embeddings, blocks, and a head."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(args.vocab, args.dim)
        self.position = torch.nn.Parameter(torch.randn(args.sequence, args.dim) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(args.dim) for _ in range(args.layers))
        self.norm = torch.nn.LayerNorm(args.dim)
        self.head = torch.nn.Linear(args.dim, args.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(args: argparse.Namespace, step: int, rank: int, world: int) -> torch.Tensor:
    """This rank's part of step ``step``'s global batch: a function of the step alone."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    tokens = torch.randint(args.vocab, (args.batch_size, args.sequence + 1), generator=generator)
    per_rank = args.batch_size // world
    return tokens[rank * per_rank:(rank + 1) * per_rank]


def build(args: argparse.Namespace, mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                                           Any]:
    torch.manual_seed(args.seed)
    model = LanguageModel(args)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 10) * 0.5 ** (step // 40))
    return model, optimizer, scheduler


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the full (unsharded) parameters and optimizer moments; the same on every rank."""
    hasher = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        hasher.update(name.encode())
        hasher.update(parameter.full_tensor().detach().numpy().tobytes())
        for key, value in sorted(optimizer.state.get(parameter, {}).items()):
            hasher.update(key.encode())
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            hasher.update(full.detach().numpy().tobytes())
    return hasher.hexdigest()


def say(line: str) -> None:
    """One line in one write: the ranks share torchrun's stdout."""
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} ranks")
    if args.progress:
        say(f"pid {rank} {os.getpid()}")
    mesh = init_device_mesh("cpu", (world,))
    model, optimizer, scheduler = build(args, mesh)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    digests: dict[str, Any] = {}
    with asyncckpt.CheckpointManager(args.checkpoint_dir, max_to_keep=args.max_to_keep,
                                     save_interval_steps=args.save_interval_steps) as manager:
        restored = manager.restore(state)
        last_saved = restored
        if restored is not None:
            digests["restored"] = {"step": restored, "digest": digest(model, optimizer)}
            if rank == 0:
                say(f"resumed from step {restored} on {world} ranks")
        for step in range(state["step"] + 1, args.steps + 1):
            tokens = batch(args, step, rank, world)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab),
                                                     tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            state["step"] = step
            if manager.maybe_save(step, state) is not None:
                last_saved = step
            if args.progress and rank == 0:
                say(f"step {step} loss {loss.item():.4f}")
        if last_saved != args.steps:
            manager.save(args.steps, state)
    digests["final"] = {"step": args.steps, "digest": digest(model, optimizer)}
    if rank == 0 and args.digest_file:
        with open(args.digest_file, "w") as out:
            json.dump(digests, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    train(parse_args(sys.argv[1:]))
