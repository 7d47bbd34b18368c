"""asyncckpt.jax: sharded jax.Array pytrees saved by the engine and restored onto any mesh and
sharding, on 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)."""

import collections
import os
import threading

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import asyncckpt
import asyncckpt.jax
from asyncckpt import _jax_restore, _jax_tree, _prefault

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (CPU) devices")

Adam = collections.namedtuple("Adam", ["mu", "nu", "count"])


class Batches:
    """A data iterator with its position as state."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def mesh(devices, shape, names):
    return Mesh(np.array(jax.devices()[:devices]).reshape(shape), names)


def put(array, sharding):
    return jax.device_put(array, sharding)


def bits(array):
    """The array's bytes, for bit-exact comparison (NaN payloads, -0.0 included)."""
    host = np.asarray(array)
    return host.dtype.str, host.shape, host.tobytes()


@pytest.fixture
def state():
    mesh8 = mesh(8, (4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16), dtype=np.float32)
    w[0, 0] = -0.0
    w[0, 1] = np.float32("nan")
    return {
        "params": {
            "w": put(w, NamedSharding(mesh8, P("data", "model"))),
            "b": put(jnp.arange(16, dtype=jnp.bfloat16), NamedSharding(mesh8, P())),
            "z": put((rng.standard_normal(32) + 1j).astype(np.complex64),
                     NamedSharding(mesh8, P(("data", "model")))),
        },
        "opt": Adam(mu=put(np.ones((64, 16), np.float32), NamedSharding(mesh8, P(None, "model"))),
                    nu=put(np.full((64, 16), 2, np.int32), NamedSharding(mesh8, P("data"))),
                    count=jnp.asarray(7, jnp.int32)),
        "host": np.arange(6, dtype=np.int64).reshape(2, 3),
        "step": 12,
        "lr": 0.001,
    }


def abstract(tree, shardings=None):
    """A pytree of ShapeDtypeStruct with ``shardings`` (a function of the path) or none."""
    def to_struct(path, leaf):
        if not isinstance(leaf, jax.Array):
            return leaf
        sharding = shardings(path, leaf) if shardings else leaf.sharding
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(to_struct, tree)


def test_restores_eight_device_shards_onto_four_devices_bit_exact(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(12, state).result()
        mesh4 = mesh(4, (4,), ("x",))

        def on_four(path, leaf):
            return NamedSharding(mesh4, P(*(["x"] + [None] * (leaf.ndim - 1))[:leaf.ndim]))

        restored = manager.restore(abstract(state, on_four))
    for before, after in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored)):
        if isinstance(before, jax.Array):
            assert after.sharding.mesh.devices.size == 4
            assert len(after.addressable_shards) == 4
        assert bits(after) == bits(before)
    assert isinstance(restored["opt"], Adam)
    assert restored["step"] == 12 and restored["lr"] == 0.001


def test_restores_replicated_as_sharded_and_sharded_as_replicated(ckpt_dir, state):
    mesh8 = mesh(8, (8,), ("x",))
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        target = {"params": {"b": jax.ShapeDtypeStruct((16,), jnp.bfloat16,
                                                       sharding=NamedSharding(mesh8, P("x"))),
                             "w": jax.ShapeDtypeStruct((64, 16), jnp.float32,
                                                       sharding=NamedSharding(mesh8, P()))}}
        restored = manager.restore(target, partial=True)
    b, w = restored["params"]["b"], restored["params"]["w"]
    assert [s.data.shape for s in b.addressable_shards] == [(2,)] * 8
    assert [s.data.shape for s in w.addressable_shards] == [(64, 16)] * 8
    assert bits(b) == bits(state["params"]["b"]) and bits(w) == bits(state["params"]["w"])


def test_stores_each_array_once_with_its_global_shape(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        manager.wait_until_finished()
        tensors = {name: (dtype, shape, nbytes)
                   for name, dtype, shape, nbytes, _ in manager._core.open(1).tensors()}
    # A replicated array (held by 8 devices) and a sharded one are each stored once, whole.
    assert tensors["params/b"] == ("bf16", [16], 32)
    assert tensors["params/w"] == ("f32", [64, 16], 64 * 16 * 4)
    assert tensors["params/z"] == ("f32", [32, 2], 32 * 8)
    assert tensors["opt/nu"] == ("i32", [64, 16], 64 * 16 * 4)


def test_a_mismatching_dtype_or_shape_raises_naming_the_leaf(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        wrong_dtype = abstract(state)
        wrong_dtype["opt"] = wrong_dtype["opt"]._replace(
            nu=jax.ShapeDtypeStruct((64, 16), jnp.float32))
        with pytest.raises(ValueError, match=r"\['opt'\]\.nu.*dtype int32.*dtype float32"):
            manager.restore(wrong_dtype)
        wrong_shape = abstract(state)
        wrong_shape["params"]["w"] = jax.ShapeDtypeStruct((16, 64), jnp.float32)
        with pytest.raises(ValueError, match=r"\['params'\]\['w'\].*\(64, 16\).*\(16, 64\)"):
            manager.restore(wrong_shape)


def test_a_leaf_the_checkpoint_lacks_raises_unless_partial(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        target = {"params": {"w": jax.ShapeDtypeStruct((64, 16), jnp.float32),
                             "new": jax.ShapeDtypeStruct((3,), jnp.float32)}}
        with pytest.raises(ValueError, match=r"\['params'\]\['new'\] is in the target"):
            manager.restore(target)
        restored = manager.restore(target, partial=True)
    assert restored["params"]["new"] is target["params"]["new"]
    assert bits(restored["params"]["w"]) == bits(state["params"]["w"])


def test_restores_a_data_iterator_in_place_beside_the_arrays(ckpt_dir, state):
    batches = Batches()
    batches.position = 41
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"state": state, "data": batches}).result()
        fresh = Batches()
        restored = manager.restore({"state": abstract(state), "data": fresh})
    assert restored["data"] is fresh and fresh.position == 41
    assert bits(restored["state"]["opt"].count) == bits(state["opt"].count)


def test_restore_onto_arrays_takes_their_sharding(ckpt_dir, state):
    mesh2 = mesh(2, (2,), ("x",))
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        target = {"params": {"w": put(jnp.zeros((64, 16)), NamedSharding(mesh2, P(None, "x")))}}
        restored = manager.restore(target, partial=True)
    assert restored["params"]["w"].sharding == target["params"]["w"].sharding
    assert bits(restored["params"]["w"]) == bits(state["params"]["w"])


def test_shares_the_managers_schedule_steps_and_retention(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir, save_interval_steps=2,
                                         max_to_keep=2) as manager:
        taken = [step for step in range(1, 8) if manager.maybe_save(step, state)]
        manager.wait_until_finished()
        assert taken == [2, 4, 6]
        assert manager.all_steps() == [4, 6] and manager.latest_step() == 6
        with pytest.raises(asyncckpt.StepAlreadyExistsError):
            manager.save(6, state)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        assert manager.restore(abstract(state))["step"] == 12
    assert asyncckpt.jax.CheckpointManager(ckpt_dir / "empty").restore(abstract(state)) is None


def test_gathers_shards_into_host_staging_kept_across_saves(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        first = dict(manager._staging._buffers)
        manager.save(2, state)
        assert first and all(manager._staging._buffers[k] is v for k, v in first.items())
        manager.wait_until_finished()
        restored = manager.restore(abstract(state))
    assert bits(restored["params"]["w"]) == bits(state["params"]["w"])


def test_starts_every_device_to_host_copy_before_gathering_any(ckpt_dir, state, monkeypatch):
    # An accelerator's path (the CPU's host view is the buffer, which needs no copy).
    monkeypatch.setattr(_jax_tree, "on_cpu", lambda array: False)
    events = []
    array_type = type(state["params"]["w"])
    real_copy = array_type.copy_to_host_async
    real_host_part = _jax_tree._host_part

    def copy_to_host_async(self):
        events.append("copy")
        return real_copy(self)

    def host_part(array, name, box):
        events.append("gather")
        return real_host_part(array, name, box)

    monkeypatch.setattr(array_type, "copy_to_host_async", copy_to_host_async)
    monkeypatch.setattr(_jax_tree, "_host_part", host_part)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
    arrays = 6  # w, b, z, mu, nu, count
    assert events == ["copy"] * arrays + ["gather"] * arrays


def test_load_without_a_target_gives_numpy_arrays(ckpt_dir, state):
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
    loaded = asyncckpt.load(ckpt_dir)
    assert loaded["params"]["b"].dtype == jnp.bfloat16
    assert bits(loaded["params"]["w"]) == bits(state["params"]["w"])
    assert loaded["opt"]["count"].shape == () and loaded["step"] == 12


@pytest.fixture
def held_handoff(monkeypatch):
    """Holds every save's hand-off (on the CPU, the gathers and the engine's copy run on a thread
    of their own) until the test sets the returned event; ``started`` is set once one waits."""
    started, release = threading.Event(), threading.Event()
    real_run = _jax_tree.Gathers.run

    def run(self):
        started.set()
        assert release.wait(60), "the test never released the hand-off"
        real_run(self)

    monkeypatch.setattr(_jax_tree.Gathers, "run", run)
    release.started = started
    return release


def cpu_state():
    mesh8 = mesh(8, (4, 2), ("data", "model"))
    rng = np.random.default_rng(1)
    return {"w": put(rng.standard_normal((64, 32), dtype=np.float32),
                     NamedSharding(mesh8, P("data", "model"))),  # gathered from 8 shards
            "b": put(rng.standard_normal(32, dtype=np.float32),
                     NamedSharding(mesh8, P()))}  # one view of a replica


def buffers(tree):
    return [shard.data.unsafe_buffer_pointer() for leaf in jax.tree_util.tree_leaves(tree)
            for shard in leaf.addressable_shards]


def test_a_donating_step_right_after_save_leaves_the_saved_values(ckpt_dir, held_handoff):
    state = cpu_state()
    saved = {name: bits(array) for name, array in state.items()}
    step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda a: a * 3 + 1, tree),
                   donate_argnums=0)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        future = manager.save(1, state)
        assert held_handoff.started.wait(60) and not future.done()  # nothing gathered yet
        updated = jax.block_until_ready(step(state))
        stepped = bits(updated["w"])
        held_handoff.set()
        future.result()
        restored = manager.restore(abstract(state))
        # Once the save let its views go, the same step does reuse its input's memory: the
        # save's views are what kept the first step from overwriting the saved buffers.
        addresses = buffers(updated)
        assert buffers(jax.block_until_ready(step(updated))) == addresses
    assert {name: bits(array) for name, array in restored.items()} == saved
    assert stepped != saved["w"]


def test_arrays_deleted_right_after_save_are_saved_as_they_were(ckpt_dir, held_handoff):
    state = cpu_state()
    saved = {name: bits(array) for name, array in state.items()}
    target = abstract(state)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        future = manager.save(1, state)
        assert held_handoff.started.wait(60) and not future.done()
        for array in state.values():
            array.delete()
        # New arrays take the memory the deleted ones would have freed.
        others = [put(np.full((64, 32), 7, np.float32), array.sharding) for array in state.values()]
        held_handoff.set()
        future.result()
        restored = manager.restore(target)
    assert {name: bits(array) for name, array in restored.items()} == saved
    assert all(bool((np.asarray(other) == 7).all()) for other in others)


def test_a_numpy_array_changed_right_after_save_is_saved_as_it_was(ckpt_dir, held_handoff):
    state = {**cpu_state(), "host": np.arange(6, dtype=np.int64)}
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        future = manager.save(1, state)
        assert held_handoff.started.wait(60)
        state["host"][:] = -1
        held_handoff.set()
        future.result()
        restored = manager.restore(abstract({**state, "host": np.zeros(6, np.int64)}))
    assert restored["host"].tolist() == list(range(6))


class RefusingEngine:
    """The manager's engine, refusing saves (as it refuses bad input) while ``refuse`` is set."""

    def __init__(self, engine):
        self.engine = engine
        self.refuse = True

    def save(self, *args):
        if self.refuse:
            raise asyncckpt.CheckpointError("refused for the test")
        return self.engine.save(*args)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_refused_handoff_fails_its_future_and_the_next_save_once(ckpt_dir):
    state = cpu_state()
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, state).result()
        refusing = manager._engine = RefusingEngine(manager._engine)
        future = manager.save(2, state)
        with pytest.raises(asyncckpt.CheckpointError, match="refused for the test"):
            future.result()
        with pytest.raises(asyncckpt.CheckpointError, match="refused for the test"):
            manager.save(3, state)  # raised here once, as a failed background save is
        refusing.refuse = False
        manager.save(2, state).result()  # step 2 was never saved: it may be saved again
        assert manager.all_steps() == [1, 2] and manager.stats().saves_failed == 0


def test_restored_replicas_share_one_memory_that_a_donating_step_leaves_alone(ckpt_dir):
    mesh8 = mesh(8, (4, 2), ("data", "model"))
    saved = np.arange(64 * 32, dtype=np.int32).reshape(64, 32)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": put(saved, NamedSharding(mesh8, P("data", "model")))}).result()
        # Four replicas of each column block, and eight of the whole.
        for spec in (P(None, "model"), P()):
            target = {"w": jax.ShapeDtypeStruct(saved.shape, saved.dtype,
                                                sharding=NamedSharding(mesh8, spec))}
            restored = manager.restore(target)["w"]
            blocks = collections.defaultdict(set)
            for shard in restored.addressable_shards:
                blocks[repr(shard.index)].add(shard.data.unsafe_buffer_pointer())
            assert all(len(addresses) == 1 for addresses in blocks.values())  # shared memory
            step = jax.jit(lambda a: a * 3 + 1, donate_argnums=0)
            stepped = jax.block_until_ready(step(restored))
            for shard in stepped.addressable_shards:  # no replica saw another's writes
                assert np.array_equal(np.asarray(shard.data), (saved * 3 + 1)[shard.index])


def test_column_blocks_lie_in_memory_faulted_in_ahead_and_so_does_the_scratch(ckpt_dir,
                                                                             monkeypatch):
    faulted, then = [], []
    real_fault_in = _prefault._fault_in
    real_read = _prefault.read_into_new_memory

    def fault_in(address, nbytes):
        faulted.append((address, nbytes))
        real_fault_in(address, nbytes)

    def read_into_new_memory(reader, specs, boxes, after=()):
        then.extend(after)
        real_read(reader, specs, boxes, after)

    monkeypatch.setattr(_prefault, "_fault_in", fault_in)
    monkeypatch.setattr(_prefault, "read_into_new_memory", read_into_new_memory)
    mesh8 = mesh(8, (4, 2), ("data", "model"))
    saved = np.random.default_rng(2).standard_normal((512, 1024), dtype=np.float32)  # 2 MiB
    sharding = NamedSharding(mesh8, P(None, "model"))  # two column blocks, four replicas each
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": put(saved, sharding)}).result()
        target = {"w": jax.ShapeDtypeStruct(saved.shape, saved.dtype, sharding=sharding)}
        restored = manager.restore(target)["w"]
    assert bits(restored) == bits(saved)
    blocks = {shard.data.unsafe_buffer_pointer() for shard in restored.addressable_shards}
    assert len(blocks) == 2 and then  # the scratch of the rearrangement

    def was_faulted(address):
        return any(start <= address < start + nbytes for start, nbytes in faulted)

    assert all(was_faulted(block) for block in blocks)
    assert all(was_faulted(address) for address, _ in then)


@pytest.mark.parametrize("widths", [[2, 2], [3, 1, 5], [1, 7], [6, 1], [4]])
@pytest.mark.parametrize("height", [1, 2, 5, 17])
def test_column_blocks_are_put_one_after_the_other_in_place(widths, height):
    rng = np.random.default_rng(height)
    band = rng.integers(0, 2**31, size=(height, sum(widths), 3), dtype=np.int32)
    expected = np.split(band.copy(), np.cumsum(widths)[:-1], axis=1)
    scratch = np.empty(band.nbytes, np.uint8)
    blocks = _jax_restore._columns_in_turn(band, widths, scratch)
    for block, want in zip(blocks, expected):
        assert np.shares_memory(block, band) and block.flags.c_contiguous
        assert np.array_equal(block, want)


@pytest.mark.parametrize("spec", [P(None, "model"), P("data", "model"), P("model", "data"),
                                  P(None, ("data", "model")), P("data", None, "model")])
def test_restores_column_blocks_bit_exact_in_the_memory_that_was_read(ckpt_dir, spec):
    mesh8 = mesh(8, (4, 2), ("data", "model"))
    shape = (16, 32) if len(spec) == 2 else (8, 4, 6)
    saved = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    with asyncckpt.jax.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": put(saved, NamedSharding(mesh8, P("data")))}).result()
        target = {"w": jax.ShapeDtypeStruct(shape, saved.dtype,
                                            sharding=NamedSharding(mesh8, spec))}
        restored = manager.restore(target)["w"]
    assert bits(restored) == bits(saved)
    for shard in restored.addressable_shards:
        assert np.array_equal(np.asarray(shard.data), saved[shard.index])
