"""TPU time estimates of kernels in the idioms production kernels use (issue #42): grouped
matmuls whose grid is sized by the group sizes (jax's megablox ``gmm`` and the megablox-style
:func:`~asickernels.simulate.tpu_estimate.idiom_kernels.grouped_matmul`, also behind a wrapper
that checks its group sizes on the host) and causal attention that skips the blocks above
the diagonal (jax's splash attention and the splash-style ``causal_attention``); the loops
libtpu compiles itself (:mod:`~asickernels.simulate.tpu_estimate.xla_idioms`: XLA's grouped
matmul, ``ragged_dot``, whose grid a metadata kernel sizes from the group sizes, and a
chunked XLA attention, a ``fori_loop`` of 64 key chunks too long to walk bundle by bundle);
and a user's HBM-bound Pallas matmul (16x8192x8192 bf16, once under its floor). Through
the public :func:`~asickernels.simulate.tpu_estimate.estimate_function` called as its
docstring says: group sizes as a real int32 array, the big operands as
``jax.ShapeDtypeStruct``.

Beside each estimate: the grid steps the CPU run counted, and the kernel's step floor (each
grid step's own products at the MXU's peak and the transfers its pipeline overlaps with it
at the HBM rate, from the run; the walked core's share on v5p), the least time that work
can take. No TPU was used: these are estimates, not measurements.

    python benchmarks/tpu_estimate_idioms/estimate.py --json benchmarks/tpu_estimate_idioms/estimate.json

``--only TEXT`` estimates the cases whose name holds it and replaces their rows in the JSON.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels import tpu_generations
from asickernels.pallas_home import pltpu
from asickernels.simulate.tpu_estimate import cases as estimate_cases
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import estimate_function, observed, xla_idioms
from asickernels.simulate.tpu_estimate import idiom_kernels as idioms

GENERATIONS = ("v5e", "v6e", "v5p")
WITH_V7X = (*GENERATIONS, "v7x")


def _group_sizes(rows: int, groups: int) -> jax.Array:
    return jnp.asarray(
        np.random.default_rng(0).multinomial(rows, np.ones(groups) / groups), jnp.int32
    )


def _gmm_args(m: int, k: int, n: int, groups: int) -> list[Any]:
    return [
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16),
        _group_sizes(m, groups),
    ]


def _ragged_dot_args(sizes: list[int]) -> list[Any]:
    return [
        jax.ShapeDtypeStruct((sum(sizes), 1024), jnp.bfloat16),
        jax.ShapeDtypeStruct((len(sizes), 1024, 1024), jnp.bfloat16),
        jnp.asarray(sizes, jnp.int32),
    ]


def _attention_args(heads: int, queries: int, keys: int) -> list[Any]:
    kv = jax.ShapeDtypeStruct((heads, keys, 128), jnp.bfloat16)
    return [jax.ShapeDtypeStruct((heads, queries, 128), jnp.bfloat16), kv, kv]


def cases() -> list[tuple[str, Callable[..., Any], list[Any], tuple[str, ...]]]:
    """(name, function, example arguments, generations)."""
    megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm").gmm
    big = (512, 1024, 1024)
    attention = jax.ShapeDtypeStruct((8, 4096, 128), jnp.bfloat16)
    chunked = functools.partial(xla_idioms.chunked_attention, chunk=512)
    matmul, matmul_specs = estimate_cases.blocked_matmul_builder(16, 8192, 8192, 16, 1024, 1024)
    return [
        (
            "megablox gmm 8192x2048x4096, 8 groups, tiles 512/1024/1024",
            functools.partial(megablox, tiling=big),
            _gmm_args(8192, 2048, 4096, 8),
            GENERATIONS,
        ),
        (
            "grouped_matmul 8192x2048x4096, 8 groups, tiles 512/1024/1024",
            functools.partial(idioms.grouped_matmul, tiling=big),
            _gmm_args(8192, 2048, 4096, 8),
            GENERATIONS,
        ),
        (
            "checked_grouped_matmul 8192x2048x4096, 8 groups, tiles 128^3",
            idioms.checked_grouped_matmul,
            _gmm_args(8192, 2048, 4096, 8),
            ("v5e",),
        ),
        (
            "grouped_matmul 16384x2048x5632, 256 groups, tiles 128^3",
            idioms.grouped_matmul,
            _gmm_args(16384, 2048, 5632, 256),
            ("v5e",),
        ),
        (
            "splash attention causal 8x4096x128, blocks 512",
            functools.partial(idioms.splash_causal, block=512),
            [attention] * 3,
            GENERATIONS,
        ),
        (
            "causal_attention 8x4096x128, blocks 512",
            functools.partial(idioms.causal_attention, block_q=512, block_kv=512),
            [attention] * 3,
            GENERATIONS,
        ),
        (
            "ragged_dot 4096x1024x1024, 8 groups of 512",
            xla_idioms.grouped_matmul,
            _ragged_dot_args([512] * 8),
            WITH_V7X,
        ),
        (
            "ragged_dot 4096x1024x1024, 8 groups of 2048..32",
            xla_idioms.grouped_matmul,
            _ragged_dot_args([2048, 1024, 512, 256, 128, 64, 32, 32]),
            WITH_V7X,
        ),
        (
            "chunked attention 4 heads x 4096 queries x 32768 keys, chunks of 512",
            chunked,
            _attention_args(4, 4096, 32768),
            WITH_V7X,
        ),
        (
            "chunked attention 8 heads x 32768 queries x 32768 keys, chunks of 512",
            chunked,
            _attention_args(8, 32768, 32768),
            ("v5e",),
        ),
        (
            "blocked Pallas matmul 16x8192x8192, blocks 16x1024x1024",
            matmul,
            [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in matmul_specs],
            WITH_V7X,
        ),
    ]


def _step_floor_s(function: Callable[..., Any], args: list[Any], generation: str) -> float:
    """The kernels' step floors (:meth:`~.observed.KernelRun.step_floor`), one core's share
    of a grid split over a chip's cores."""
    from asickernels.simulate.tpu_estimate import user_function

    args, fixed, _ = user_function._trace_time_values(function, args)
    if fixed:
        function = user_function.with_values(function, fixed, len(args) + len(fixed))
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        seen = observed.observe(function, args)
    facts = tpu_generations.get(generation)
    assert facts.clock_hz is not None
    rates = cost.product_ops_per_cycle(generation)
    cycles = sum(
        kernel.step_floor(*rates, cost.hbm_bytes_per_cycle(generation)) for kernel in seen.kernels
    )
    return cycles / facts.clock_hz / facts.cores_per_device


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", help="cases whose name contains this")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, function, example, generations in cases():
        if args.only and args.only not in name:
            continue
        start = time.perf_counter()
        try:
            estimates = estimate_function(function, *example, generations=generations)
        except (ValueError, cost.EstimateError) as error:
            print(f"{name}: {error}", flush=True)
            rows.append({"case": name, "error": str(error)})
            continue
        for estimate in estimates:
            floor = _step_floor_s(function, list(example), estimate.generation)
            row = {
                "case": name,
                "generation": estimate.generation,
                "device_ms": estimate.device_s * 1e3,
                "kernel_ms": estimate.kernel_s * 1e3,
                "step_floor_ms": floor * 1e3,
                "function_floor_ms": (estimate.floor_s or 0.0) * 1e3,
                "hbm_gb": estimate.hbm_bytes / 1e9,
                "raised_to_step_floor": estimate.step_floor_cycles > 0,
                "assumptions": list(estimate.assumptions),
            }
            rows.append(row)
            print(
                f"{name} {estimate.generation}: {row['device_ms']:.4f} ms (kernel "
                f"{row['kernel_ms']:.4f}, step floor {row['step_floor_ms']:.4f}), "
                f"{row['hbm_gb']:.3f} GB [{time.perf_counter() - start:.0f} s]",
                flush=True,
            )
    if args.json:
        path = pathlib.Path(args.json)
        if args.only and path.exists():  # keep the rows of the cases not run
            rows = [r for r in json.loads(path.read_text()) if args.only not in r["case"]] + rows
        path.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
