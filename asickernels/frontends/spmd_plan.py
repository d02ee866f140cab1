"""The plan for a TPU pod slice, before renting one: compile the sharded programs of
:mod:`asickernels.frontends.jax_spmd` with libtpu for a TPU topology (no TPU
needed) and report the collectives the compiler inserted and the memory per device.

Programs (``D`` devices; per device the seed sizes):

* ``giou``: GIOU of ``[D*1024, 256, 4]`` box pairs, data-parallel.
* ``giou_loss_grad``: the masked mean GIOU loss and its gradient (a training step's loss).
* ``nms``: NMS of ``[D*8, 1024]`` boxes (128 outputs, IoU threshold 0.1), data-parallel.
* ``int8_matmul_mn`` / ``int8_matmul_k``: an 8192^3 int8 matmul with M and N sharded over a
  2-D mesh, and with M and K sharded (an exact int32 all-reduce of partial products).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asickernels.frontends import jax_spmd
from asickernels.simulate import tpu_compile

DEFAULT_TOPOLOGIES = ("v5e:2x2", "v5e:4x4")
COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)
# A collective HLO instruction: "%name = <shape> <opcode>(", the shape possibly a tuple;
# async collectives are split into "<opcode>-start" and "<opcode>-done".
_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>.*?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_LAYOUT = re.compile(r"\{[^{}]*\}")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program: its HLO opcode and result shape."""

    op: str
    shape: str


@dataclasses.dataclass(frozen=True)
class ProgramPlan:
    """A compiled program: its collectives and its memory per device (bytes)."""

    name: str
    description: str
    collectives: tuple[Collective, ...]
    memory: dict[str, int]


@dataclasses.dataclass(frozen=True)
class TopologyPlan:
    topology: str
    device_kind: str
    num_devices: int
    backend: str
    programs: tuple[ProgramPlan, ...]


def collectives_in(hlo_text: str) -> tuple[Collective, ...]:
    """The collective instructions in compiled HLO text, with layout-free result shapes
    (an async collective counts once, by its ``-start`` half)."""
    return tuple(
        Collective(match["op"], _LAYOUT.sub("", match["shape"]))
        for line in hlo_text.splitlines()
        if (match := _COLLECTIVE.search(line))
    )


def _memory(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    fields = ("argument", "output", "temp", "alias", "generated_code")
    return {f: int(getattr(stats, f"{f}_size_in_bytes", 0)) for f in fields}


def _mesh_2d(devices: list[Any]) -> Mesh:
    count = len(devices)
    rows = max(d for d in range(1, math.isqrt(count) + 1) if count % d == 0)
    return Mesh(np.array(devices).reshape(rows, count // rows), ("x", "y"))


def _programs(
    devices: list[Any], backend: str
) -> list[tuple[str, str, Callable[..., Any], list[jax.ShapeDtypeStruct]]]:
    """(name, description, function, sharded argument specs) for each program."""
    count = len(devices)
    data = Mesh(np.array(devices), ("data",))
    grid = _mesh_2d(devices)

    def arg(shape: tuple[int, ...], dtype: Any, mesh: Mesh, *spec: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(
            shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec))
        )

    batch = PartitionSpec("data")
    pairs = (count * 1024, 256)
    boxes = arg((*pairs, 4), jnp.float32, data, "data")
    mask = arg(pairs, jnp.bool_, data, "data")
    images = (count * 8, 1024)
    k = 8192
    x_m_k = arg((k, k), jnp.int8, grid, "x", "y")
    x_m = arg((k, k), jnp.int8, grid, "x", None)
    y_n = arg((k, k), jnp.int8, grid, None, "y")
    y_k = arg((k, k), jnp.int8, grid, "y", None)

    def giou(b1: jax.Array, b2: jax.Array) -> jax.Array:
        return jax_spmd.giou(b1, b2, mesh=data, batch_spec=batch, backend=backend)

    def loss_and_grad(p: jax.Array, t: jax.Array, m: jax.Array) -> Any:
        def loss(p: jax.Array) -> jax.Array:
            return jax_spmd.giou_loss(p, t, mesh=data, batch_spec=batch, mask=m, backend=backend)

        return jax.value_and_grad(loss)(p)

    def nms(b: jax.Array, s: jax.Array) -> Any:
        return jax_spmd.nms(
            b, s, mesh=data, batch_spec=batch, iou_threshold=0.1, max_output_size=128,
            backend=backend,
        )  # fmt: skip

    def matmul_mn(x: jax.Array, y: jax.Array) -> jax.Array:
        return jax_spmd.int8_matmul(x, y, mesh=grid, m_axis="x", n_axis="y", backend=backend)

    def matmul_k(x: jax.Array, y: jax.Array) -> jax.Array:
        return jax_spmd.int8_matmul(x, y, mesh=grid, m_axis="x", k_axis="y", backend=backend)

    mesh_2d = "x".join(str(s) for s in grid.devices.shape)
    return [
        ("giou", f"GIOU {pairs[0]}x{pairs[1]} pairs, batch over {count}", giou, [boxes, boxes]),
        (
            "giou_loss_grad",
            f"masked mean GIOU loss + gradient, {pairs[0]}x{pairs[1]} pairs over {count}",
            loss_and_grad,
            [boxes, boxes, mask],
        ),
        (
            "nms",
            f"NMS {images[0]} images x {images[1]} boxes -> 128, batch over {count}",
            nms,
            [arg((*images, 4), jnp.float32, data, "data"), arg(images, jnp.float32, data, "data")],
        ),
        ("int8_matmul_mn", f"int8 {k}^3, M x N over a {mesh_2d} mesh", matmul_mn, [x_m, y_n]),
        ("int8_matmul_k", f"int8 {k}^3, M x K over a {mesh_2d} mesh", matmul_k, [x_m_k, y_k]),
    ]


def spmd_plan(topology: str, backend: str = "pallas_tpu") -> TopologyPlan:
    """Compiles every program for ``topology`` (e.g. ``"v5e:2x2"``) with libtpu.

    ``backend`` is the per-shard kernel: ``"pallas_tpu"`` builds the Mosaic kernels for
    the topology's TPU generation; ``"xla"`` the plain XLA ops. Raises ValueError for a
    topology libtpu does not know, ModuleNotFoundError where libtpu is not installed.
    """
    from jax.experimental import topologies

    tpu_compile.set_libtpu_environment()
    missing = tpu_compile.libtpu_status()
    if missing:
        raise ModuleNotFoundError(f"cannot compile for TPU here: {missing}", name="libtpu")
    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as error:
        raise ValueError(
            f"topology {topology!r} is not a TPU topology libtpu knows, such as 'v5e:2x2' ({error})"
        ) from error
    devices: list[Any] = list(description.devices)
    programs = []
    # Pallas kernels lower to Mosaic for the devices' generation by themselves.
    for name, text, function, args in _programs(devices, backend):
        compiled = jax.jit(function).lower(*args).compile()
        programs.append(
            ProgramPlan(name, text, collectives_in(compiled.as_text() or ""), _memory(compiled))
        )
    return TopologyPlan(topology, devices[0].device_kind, len(devices), backend, tuple(programs))


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def format_plan(plan: TopologyPlan) -> str:
    """A plain-text table: one row per program."""
    lines = [
        f"{plan.topology}: {plan.num_devices} x {plan.device_kind}, per-shard kernels on "
        f"{plan.backend!r}",
        f"  {'program':<16} {'collectives inserted':<52} {'args':>10} {'out':>10} {'temp':>10}",
    ]
    for program in plan.programs:
        counts: dict[str, int] = {}
        for c in program.collectives:
            key = f"{c.op} {c.shape}"
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{n}x {k}" for k, n in counts.items()) or "none"
        mem = program.memory
        lines.append(
            f"  {program.name:<16} {summary:<52} {_mib(mem['argument']):>10} "
            f"{_mib(mem['output']):>10} {_mib(mem['temp']):>10}"
        )
        lines.append(f"  {'':<16} ({program.description})")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    try:
        plans = [spmd_plan(t, backend=args.backend) for t in args.topology or DEFAULT_TOPOLOGIES]
    except (ModuleNotFoundError, ValueError) as error:
        print(f"asickernels spmd-plan: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in plans], indent=2))
    else:
        print("\n\n".join(format_plan(p) for p in plans))
        print("\nmemory is per device (compiled.memory_analysis()); collectives from the HLO")
    return 0


# `asickernels spmd-plan --help`, printed as written (lines of at most 78 characters).
SPMD_PLAN_DESCRIPTION = """\
The plan for a TPU pod slice, before renting one: compile the sharded programs
(GIOU, the GIOU loss and its gradient, NMS, int8 matmul) for a TPU topology
with libtpu, on this machine: no TPU needed. Prints, per program, the
collectives the compiler inserted and the memory each device needs. Exits 2
without libtpu or for a topology libtpu does not know."""


def register_cli(subparsers: Any) -> None:
    """Adds ``spmd-plan`` to the ``asickernels`` command line."""
    parser = subparsers.add_parser(
        "spmd-plan",
        help="compile the sharded programs for TPU topologies; show collectives and memory",
        description=SPMD_PLAN_DESCRIPTION,
        epilog=f"Needs libtpu: {tpu_compile.LIBTPU_INSTALL}.\n"
        "More: docs/tpu-compile-and-estimates.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--topology", action="append",
        help=f"TPU topology, repeatable (default: {' and '.join(DEFAULT_TOPOLOGIES)})",
    )  # fmt: skip
    parser.add_argument(
        "--backend", default="pallas_tpu", choices=("pallas_tpu", "xla"),
        help="per-shard kernels (default: pallas_tpu, built for the topology's TPU)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_run)
