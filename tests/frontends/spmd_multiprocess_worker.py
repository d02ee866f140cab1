"""One process of the multi-process SPMD check (run by tests/frontends/test_spmd_jax.py).

Usage: python spmd_multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT

Each process has 4 CPU devices; the processes join with ``jax.distributed.initialize``
over localhost and run the sharded ops on one global mesh with CPU collectives. Every
process then gathers the results and compares them with the unsharded op on its own
device. Prints "ok" and exits 0 when all agree.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import asickernels
from asickernels.frontends import jax_spmd

BACKEND = "xla"


def main(process_id: int, num_processes: int, port: int) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=120,
    )
    devices = jax.devices()
    assert len(devices) == 4 * num_processes, devices
    assert jax.process_count() == num_processes
    data = Mesh(np.array(devices), ("data",))
    grid = Mesh(np.array(devices).reshape(num_processes, 4), ("x", "y"))

    def put(array: np.ndarray, mesh: Mesh, *spec: object) -> jax.Array:
        """The global array, sharded; every process holds only its devices' shards."""
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    def gathered(array: jax.Array) -> np.ndarray:
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))

    rng = np.random.default_rng(0)  # the same global inputs in every process
    batch = 4 * num_processes * 2
    xy = rng.integers(0, 60, (batch, 64, 2))
    boxes = np.concatenate([xy, xy + rng.integers(1, 20, (batch, 64, 2))], -1).astype(np.float32)
    targets = boxes + rng.integers(-3, 4, boxes.shape).astype(np.float32)
    mask = rng.uniform(size=(batch, 64)) < 0.7
    scores = rng.permutation(batch * 64).reshape(batch, 64).astype(np.float32)
    x = rng.integers(-128, 128, (64, 512), dtype=np.int8)
    y = rng.integers(-128, 128, (512, 32), dtype=np.int8)

    spec = PartitionSpec("data")
    got = jax_spmd.giou(
        put(boxes, data, "data"), put(targets, data, "data"),
        mesh=data, batch_spec=spec, backend=BACKEND,
    )  # fmt: skip
    np.testing.assert_array_equal(gathered(got), asickernels.giou(boxes, targets, backend=BACKEND))

    loss = jax_spmd.giou_loss(
        put(boxes, data, "data"), put(targets, data, "data"), mesh=data, batch_spec=spec,
        mask=put(mask, data, "data"), backend=BACKEND,
    )  # fmt: skip
    want = asickernels.giou_loss(boxes, targets, mask=mask, backend=BACKEND)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)

    indices, num_valid = jax_spmd.nms(
        put(boxes, data, "data"), put(scores, data, "data"), mesh=data, batch_spec=spec,
        iou_threshold=0.3, max_output_size=16, backend=BACKEND,
    )  # fmt: skip
    want_indices, want_valid = asickernels.nms(
        boxes, scores, iou_threshold=0.3, max_output_size=16, backend=BACKEND
    )
    np.testing.assert_array_equal(gathered(indices), want_indices)
    np.testing.assert_array_equal(gathered(num_valid), want_valid)

    # K sharded across both processes: the int32 partial products cross the process boundary.
    product = jax_spmd.int8_matmul(
        put(x, grid, "y", "x"), put(y, grid, "x", None), mesh=grid, m_axis="y", k_axis="x",
        backend=BACKEND,
    )  # fmt: skip
    np.testing.assert_array_equal(gathered(product), x.astype(np.int32) @ y.astype(np.int32))
    print(f"process {process_id}: ok", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
