#!/usr/bin/env python3
"""Trains an MLP in plain JAX, sharded over a Mesh of 8 devices, checkpointing with
asyncckpt.jax; run it again with the same --checkpoint-dir and it resumes where the last durable
checkpoint left off, and ends bit for bit where an uninterrupted run ends.

    python examples/jax_train.py --checkpoint-dir /tmp/jax-mlp

(python: a venv with jax and this project installed by `pip install .[jax]`; or, from a CMake
build tree, PYTHONPATH=build/python .venv/bin/python with the project's .venv.) On a machine
without accelerators the 8 devices are CPU devices (XLA_FLAGS'
--xla_force_host_platform_device_count, set here); --devices 4 resumes the same checkpoint on a
mesh of 4.

The mesh is (devices / 2) x 2, axes "data" and "model": each batch is split over "data", the
hidden layer over "model". Adam is written out (no optax). The data iterator, whose position is
its state, sits in the checkpointed pytree beside the parameters and optimizer state, so a
resumed run reads the same batches. Saves land on the multiples of --save-interval-steps.
"""

import argparse
import hashlib
import json
import os
import sys


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where checkpoints go")
    parser.add_argument("--steps", type=int, default=300, help="last global step")
    parser.add_argument("--save-interval-steps", type=int, default=10,
                        help="save at the multiples of N")
    parser.add_argument("--devices", type=int, default=8, help="devices of the mesh (even)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="print 'step N' after each step")
    parser.add_argument("--digest-file", help="write the final state's digests here (JSON)")
    args = parser.parse_args(argv)
    if args.devices < 2 or args.devices % 2:
        parser.error("--devices must be an even number >= 2")
    return args


ARGS = parse_args(sys.argv[1:])
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={ARGS.devices}")

import jax  # after XLA_FLAGS, which JAX reads once
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import asyncckpt.jax

FEATURES = 32
CLASSES = 10


class Batches:
    """Synthetic classification data: batch i is a function of (seed, i) alone; a teacher
    matrix drawn from the seed labels it. Its state is the position."""

    def __init__(self, seed, batch_size):
        self.seed = seed
        self.batch_size = batch_size
        self.position = 0
        self.teacher = np.random.default_rng(seed).standard_normal((FEATURES, CLASSES))

    def batch(self, index):
        x = np.random.default_rng((self.seed, index)).standard_normal(
            (self.batch_size, FEATURES)).astype(np.float32)
        return x, np.argmax(x @ self.teacher, axis=1).astype(np.int32)

    def __next__(self):
        self.position += 1
        return self.batch(self.position)

    def state_dict(self):
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state):
        if state["seed"] != self.seed:
            raise ValueError(f"the checkpoint's data has seed {state['seed']}, not {self.seed}")
        self.position = state["position"]


def shardings(mesh):
    """Where each leaf of the parameters lives: the hidden layer split over "model"."""
    def on(*spec):
        return NamedSharding(mesh, P(*spec))

    return {"l0": {"w": on(None, "model"), "b": on("model")},
            "l1": {"w": on("model", None), "b": on()}}


def init_params(seed, hidden, placed):
    rng = np.random.default_rng(seed + 1)
    params = {"l0": {"w": rng.standard_normal((FEATURES, hidden)) / np.sqrt(FEATURES),
                     "b": np.zeros(hidden)},
              "l1": {"w": rng.standard_normal((hidden, CLASSES)) / np.sqrt(hidden),
                     "b": np.zeros(CLASSES)}}
    return jax.tree.map(lambda a, s: jax.device_put(a.astype(np.float32), s), params, placed)


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["l0"]["w"] + params["l0"]["b"])
    logits = hidden @ params["l1"]["w"] + params["l1"]["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, CLASSES), axis=-1))


def make_train_step(lr, placed, replicated):
    b1, b2, eps = 0.9, 0.999, 1e-8
    opt_placed = {"mu": placed, "nu": placed, "count": replicated}

    def train_step(params, opt, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        count = opt["count"] + 1
        t = count.astype(jnp.float32)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
        params = jax.tree.map(
            lambda p, m, v: p - lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps),
            params, mu, nu)
        return params, {"mu": mu, "nu": nu, "count": count}, loss

    return jax.jit(train_step, out_shardings=(placed, opt_placed, replicated))


def abstract(tree):
    """The restore target of a state: each array as a ShapeDtypeStruct with its sharding."""
    def to_struct(leaf):
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        return leaf

    return jax.tree.map(to_struct, tree)


def digests(state):
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state["params"])[0]:
        out["params" + jax.tree_util.keystr(path)] = hashlib.sha256(
            np.asarray(leaf).tobytes()).hexdigest()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state["opt"])[0]:
        out["opt" + jax.tree_util.keystr(path)] = hashlib.sha256(
            np.asarray(leaf).tobytes()).hexdigest()
    out["data.position"] = str(state["data"].position)
    return out


def accuracy(params, batches):
    """On 512 held-out examples (drawn apart from every training batch)."""
    x = np.random.default_rng((batches.seed, 2**31)).standard_normal((512, FEATURES))
    y = np.argmax(x @ batches.teacher, axis=1)
    hidden = np.tanh(x @ np.asarray(params["l0"]["w"]) + np.asarray(params["l0"]["b"]))
    logits = hidden @ np.asarray(params["l1"]["w"]) + np.asarray(params["l1"]["b"])
    return float(np.mean(np.argmax(logits, axis=1) == y))


def main():
    devices = jax.devices()[:ARGS.devices]
    if len(devices) < ARGS.devices:
        sys.exit(f"--devices {ARGS.devices}: only {len(devices)} devices")
    mesh = Mesh(np.array(devices).reshape(ARGS.devices // 2, 2), ("data", "model"))
    placed = shardings(mesh)
    replicated = NamedSharding(mesh, P())
    params = init_params(ARGS.seed, ARGS.hidden, placed)
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = {"params": params,
             "opt": {"mu": zeros, "nu": zeros,
                     "count": jax.device_put(jnp.zeros((), jnp.int32), replicated)},
             "data": Batches(ARGS.seed, ARGS.batch_size), "step": 0}
    train_step = make_train_step(ARGS.lr, placed, replicated)
    batch_sharding = NamedSharding(mesh, P("data"))

    with asyncckpt.jax.CheckpointManager(ARGS.checkpoint_dir,
                                         save_interval_steps=ARGS.save_interval_steps,
                                         max_to_keep=3) as manager:
        restored = manager.restore(abstract(state))
        if restored is not None:
            state = restored
            print(f"resumed from step {state['step']}", flush=True)
        pending = []  # saves not yet reported durable (--progress)
        for step in range(state["step"] + 1, ARGS.steps + 1):
            x, y = next(state["data"])
            params, opt, _ = train_step(state["params"], state["opt"],
                                        jax.device_put(x, batch_sharding),
                                        jax.device_put(y, batch_sharding))
            state = {**state, "params": params, "opt": opt, "step": step}
            future = manager.maybe_save(step, state)
            if ARGS.progress:
                pending += [future] if future is not None else []
                for done in [f for f in pending if f.done()]:
                    print(f"durable {done.step}", flush=True)
                    pending.remove(done)
                print(f"step {step}", flush=True)
        manager.wait_until_finished()
        if manager.latest_step() != state["step"] and state["step"] > 0:
            manager.save(state["step"], state)  # the last step, off the schedule
    print(f"step {state['step']} accuracy {accuracy(state['params'], state['data']):.4f}",
          flush=True)
    if ARGS.digest_file:
        with open(ARGS.digest_file, "w") as out:
            json.dump({"step": state["step"], "digests": digests(state),
                       "accuracy": accuracy(state["params"], state["data"])}, out)


if __name__ == "__main__":
    main()
