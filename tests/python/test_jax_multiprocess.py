"""asyncckpt.jax across two processes of jax.distributed on CPU (4 devices each, a Mesh of 8):
each process writes the shards it addresses and a replica once, both commit one checkpoint, and
each restores its own boxes of another sharding. Skipped where the processes cannot start."""

import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

WORKER = textwrap.dedent("""
    import os, sys
    rank, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    try:
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                                   process_id=rank, initialization_timeout=60)
    except Exception as error:
        print("CANNOT_START", error, flush=True)
        sys.exit(3)
    import numpy as np, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import asyncckpt.jax

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("proc", "x"))
    full = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)

    def make(spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])

    def target(spec):
        return jax.ShapeDtypeStruct(full.shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    # Rows split between the processes; whole on both; columns split within each process.
    state = {"rows": make(P("proc", "x")), "replicated": make(P()), "cols": make(P(None, "x")),
             "step": 5}
    with asyncckpt.jax.CheckpointManager(directory) as manager:
        manager.save(5, state).result()
        manager.wait_until_finished()
        stored = {name: nbytes for name, _, _, nbytes, _ in manager._core.open(5).tensors()}
        restored = manager.restore({"rows": target(P("x", "proc")),
                                    "replicated": target(P(("proc", "x"))),
                                    "cols": target(P()), "step": 0})
        # A mesh whose devices alternate between the processes: each process addresses every
        # other block of rows, not one box. Restored box by box; refused on save, naming it.
        by_process = [jax.local_devices(process_index=p) for p in (0, 1)]
        alternating = Mesh(np.array([d for pair in zip(*by_process) for d in pair]), ("all",))
        spread = NamedSharding(alternating, P("all"))
        restored["spread"] = manager.restore(
            {"rows": jax.ShapeDtypeStruct(full.shape, jnp.float32, sharding=spread)})["rows"]
        for name in ("rows", "replicated", "cols", "spread"):
            for shard in restored[name].addressable_shards:
                assert np.array_equal(np.asarray(shard.data), full[shard.index]), name
        try:
            manager.save(6, {"spread": jax.make_array_from_callback(
                full.shape, spread, lambda index: full[index])})
        except ValueError as error:
            assert "'spread'" in str(error) and "one box" in str(error), error
            print("REFUSED", flush=True)
        print("OK", rank, restored["step"], manager.all_steps(), sorted(stored.items()),
              flush=True)
""")


def free_port():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_two_processes_save_their_shards_once_and_restore_another_sharding(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, str(worker), str(rank), port,
                                   str(tmp_path / "ckpt")], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail("the two JAX processes did not finish in 240 s")
        outputs.append(out)
    if any("CANNOT_START" in out for out in outputs):
        pytest.skip("jax.distributed cannot start two processes here: "
                    + " ".join(line for out in outputs for line in out.splitlines()
                               if "CANNOT_START" in line))
    whole = 8 * 16 * 4
    for rank, (process, out) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, out
        assert "REFUSED" in out, out
        assert (f"OK {rank} 5 [5] [('cols', {whole}), ('replicated', {whole}), "
                f"('rows', {whole})]") in out, out
