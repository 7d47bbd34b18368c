"""asyncckpt.orbax: asyncckpt as the handler of Orbax's own CheckpointManager, whose step
directories, metadata, schedule and keep policies stay Orbax's."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import numpy as np
import pytest

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import asyncckpt.orbax

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (CPU) devices")


def state_at(step):
    mesh8 = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    w = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) * step
    return {"w": jax.device_put(w, NamedSharding(mesh8, P("data", "model"))),
            "b": jax.device_put(jnp.full((16,), step, jnp.bfloat16), NamedSharding(mesh8, P())),
            "step": step}


def on_four_devices():
    mesh4 = Mesh(np.array(jax.devices()[:4]), ("x",))
    return {"w": jax.ShapeDtypeStruct((64, 16), jnp.float32,
                                      sharding=NamedSharding(mesh4, P(None, "x"))),
            "b": jax.ShapeDtypeStruct((16,), jnp.bfloat16, sharding=NamedSharding(mesh4, P("x"))),
            "step": 0}


def bits(array):
    host = np.asarray(array)
    return host.dtype.str, host.shape, host.tobytes()


def test_round_trips_under_orbax_checkpoint_manager_with_its_policies(ckpt_dir):
    options = ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2)
    with ocp.CheckpointManager(ckpt_dir, options=options) as manager:
        saved = [step for step in range(2, 11) if manager.should_save(step)
                 and manager.save(step, args=asyncckpt.orbax.AsyncckptSave(state_at(step)))]
        manager.wait_until_finished()
        assert saved == [2, 4, 6, 8, 10]
        assert manager.all_steps() == [8, 10] and manager.latest_step() == 10
        assert not manager.should_save(11) and manager.should_save(12)
    # Orbax's layout: <dir>/<step>/<item>/, the engine's checkpoint inside the item.
    assert sorted(os.listdir(ckpt_dir)) == ["10", "8"]
    item = ckpt_dir / "10" / "default"
    assert os.path.exists(item / "model.ckpt-0" / "index")
    with ocp.CheckpointManager(ckpt_dir) as manager:
        assert manager.all_steps() == [8, 10]
        restored = manager.restore(10, args=asyncckpt.orbax.AsyncckptRestore(on_four_devices()))
    expected = state_at(10)
    assert restored["step"] == 10
    for name in ("w", "b"):
        assert bits(restored[name]) == bits(expected[name])
        assert len(restored[name].addressable_shards) == 4


def test_sits_beside_other_items_in_a_composite(ckpt_dir):
    with ocp.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, args=ocp.args.Composite(
            state=asyncckpt.orbax.AsyncckptSave(state_at(1)),
            extra=ocp.args.JsonSave({"epoch": 3})))
        manager.wait_until_finished()
        restored = manager.restore(1, args=ocp.args.Composite(
            state=asyncckpt.orbax.AsyncckptRestore(on_four_devices()),
            extra=ocp.args.JsonRestore()))
    assert restored["extra"] == {"epoch": 3}
    assert bits(restored["state"]["w"]) == bits(state_at(1)["w"])


def test_item_metadata_is_a_target_and_no_target_gives_numpy(ckpt_dir):
    with ocp.CheckpointManager(ckpt_dir) as manager:
        manager.save(3, args=asyncckpt.orbax.AsyncckptSave(state_at(3)))
        manager.wait_until_finished()
        abstract = manager.item_metadata(3)
        assert abstract["w"].shape == (64, 16) and abstract["b"].dtype == jnp.bfloat16
        loaded = manager.restore(3, args=asyncckpt.orbax.AsyncckptRestore())
    assert isinstance(loaded["w"], np.ndarray) and bits(loaded["w"]) == bits(state_at(3)["w"])


def test_a_mismatching_target_raises_naming_the_leaf(ckpt_dir):
    with ocp.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, args=asyncckpt.orbax.AsyncckptSave(state_at(1)))
        manager.wait_until_finished()
        target = on_four_devices()
        target["w"] = jax.ShapeDtypeStruct((64, 16), jnp.float16)
        with pytest.raises(ValueError, match=r"\['w'\].*dtype float32.*dtype float16"):
            manager.restore(1, args=asyncckpt.orbax.AsyncckptRestore(target))


def test_bad_options_raise_naming_them():
    with pytest.raises(TypeError, match="no_such_option"):
        asyncckpt.orbax.AsyncckptCheckpointHandler(no_such_option=1)
