#!/usr/bin/env python3
"""Trains a small convolutional network on synthetic 8x8 digits, checkpointing with asyncckpt;
run it again with the same --checkpoint-dir and it resumes where the last durable checkpoint
left off, and ends bit for bit where an uninterrupted run ends.

    python examples/pytorch_train.py --checkpoint-dir /tmp/digits

(python: a venv of your own with torch and this project installed by `pip install .`; or, from
a CMake build tree, PYTHONPATH=build/python .venv/bin/python with the project's .venv.)

The data is made here, nothing is downloaded: each image is one of ten digit glyphs, moved by
up to a pixel, drawn at a random intensity and covered in Gaussian noise, all drawn from --seed.

Deterministic: seeded, one thread, torch.use_deterministic_algorithms, and each step's batch a
function of the step alone, so the checkpoint holds everything the run depends on: the model,
the optimizer, its learning-rate schedule, and the random generator that dropout draws from.
All four sit in the state as objects; asyncckpt stores their state_dict() and restores them
through load_state_dict(). Saves land on the multiples of --save-interval-steps, in every run (Orbax's rule).
"""

import argparse
import hashlib
import json
import sys

import numpy as np
import torch

import asyncckpt

# The ten classes, 0 to 9, as 8x8 glyphs side by side ('#' ink, '.' paper).
GLYPHS = """
..####.. ...##... ..####.. ..####.. ....##.. .######. ..####.. .######. ..####.. ..####..
.##..##. ..###... .##..##. .##..##. ...###.. .##..... .##..... .....##. .##..##. .##..##.
.##..##. .####... .....##. .....##. ..####.. .#####.. .##..... ....##.. .##..##. .##..##.
.##..##. ...##... ....##.. ...###.. .##.##.. .....##. .#####.. ...##... ..####.. ..#####.
.##..##. ...##... ...##... .....##. .######. .....##. .##..##. ...##... .##..##. .....##.
.##..##. ...##... ..##.... .##..##. ....##.. .##..##. .##..##. ..##.... .##..##. .....##.
..####.. .######. .######. ..####.. ....##.. ..####.. ..####.. ..##.... ..####.. ..####..
........ ........ ........ ........ ........ ........ ........ ........ ........ ........
"""


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where checkpoints go")
    parser.add_argument("--steps", type=int, default=600, help="last global step")
    parser.add_argument("--save-interval-steps", type=int, default=25,
                        help="save at the multiples of N")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=100, help="print accuracy every N steps")
    parser.add_argument("--sync", action="store_true", help="save on the training thread")
    parser.add_argument("--progress", action="store_true", help="print 'step N' after each step")
    parser.add_argument("--digest-file", help="write the final state's digests here (JSON)")
    return parser.parse_args(argv)


class RandomState:
    """torch's global random generator as a stateful object."""

    def state_dict(self):
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch"])


class DigitsNet(torch.nn.Module):
    """Two convolutions and two dense layers over 8x8 images."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
            torch.nn.Dropout(0.25), torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def glyphs():
    """The ten class prototypes: a (10, 8, 8) float32 array of 0s and 1s."""
    rows = [line.split() for line in GLYPHS.strip().splitlines()]
    return np.array([[[c == "#" for c in row[digit]] for row in rows] for digit in range(10)],
                    dtype=np.float32)


def synthetic_digits(seed, count=1800, noise=0.25):
    """(images, labels): `count` 8x8 float32 images in [0, 1] and their int64 digits, a function
    of `seed` alone. Each is a glyph moved by up to a pixel each way, at an intensity in
    [0.5, 1), plus Gaussian noise of standard deviation `noise`."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count).astype(np.int64)
    padded = np.pad(glyphs()[labels], ((0, 0), (1, 1), (1, 1)))
    dy, dx = rng.integers(0, 3, (2, count))
    rows = (dy[:, None] + np.arange(8))[:, :, None]
    cols = (dx[:, None] + np.arange(8))[:, None, :]
    images = padded[np.arange(count)[:, None, None], rows, cols]
    images = images * rng.uniform(0.5, 1.0, (count, 1, 1)) + rng.normal(0.0, noise, images.shape)
    return np.clip(images, 0.0, 1.0).astype(np.float32), labels


def load_data(seed, test_count=300):
    """((train images, labels), (test images, labels)) as tensors, images shaped (N, 1, 8, 8)."""
    images, labels = synthetic_digits(seed)
    images, labels = torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels)
    return ((images[test_count:], labels[test_count:]),
            (images[:test_count], labels[:test_count]))


def batch_indices(step, n, batch_size, seed):
    """The batch of global step `step` (1-based): a fresh permutation every epoch."""
    per_epoch = n // batch_size
    epoch, i = divmod(step - 1, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return torch.from_numpy(order[i * batch_size:(i + 1) * batch_size])


def accuracy(model, images, labels):
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(dim=1) == labels).sum().item()
    model.train()
    return correct / len(labels)


def digests(model, optimizer, scheduler):
    """sha256 of every tensor's bytes (and of the optimizer's and scheduler's settings)."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[f"model/{name}"] = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
    optimizer_state = optimizer.state_dict()
    for index, entry in optimizer_state["state"].items():
        for name, tensor in entry.items():
            out[f"optimizer/{index}/{name}"] = hashlib.sha256(
                tensor.numpy().tobytes()).hexdigest()
    out["optimizer/param_groups"] = hashlib.sha256(
        repr(optimizer_state["param_groups"]).encode()).hexdigest()
    out["scheduler"] = hashlib.sha256(repr(scheduler.state_dict()).encode()).hexdigest()
    return out


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    (train_x, train_y), (test_x, test_y) = load_data(args.seed)
    model = DigitsNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
             "rng": RandomState(), "step": 0}

    with asyncckpt.CheckpointManager(args.checkpoint_dir,
                                     save_interval_steps=args.save_interval_steps,
                                     max_to_keep=3, asynchronous=not args.sync) as manager:
        if manager.restore(state) is not None:
            print(f"resumed from step {state['step']}", flush=True)
        for step in range(state["step"] + 1, args.steps + 1):
            batch = batch_indices(step, len(train_y), args.batch_size, args.seed)
            loss = torch.nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            state["step"] = step
            manager.maybe_save(step, state)
            if args.progress:
                print(f"step {step}", flush=True)
            if step % args.eval_every == 0 or step == args.steps:
                print(f"step {step} loss {loss.item():.4f} "
                      f"test accuracy {accuracy(model, test_x, test_y):.4f}", flush=True)
        blocked = [s.blocked_seconds for s in manager.stats().saves]
    final = accuracy(model, test_x, test_y)
    print(f"final test accuracy {final!r} after {args.steps} steps; {len(blocked)} saves in this "
          f"run, blocked {sum(blocked):.4f} s in all", flush=True)
    if args.digest_file:
        with open(args.digest_file, "w") as f:
            json.dump({"accuracy": final, "digests": digests(model, optimizer, scheduler)}, f,
                      indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
