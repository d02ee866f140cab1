"""The SPMD launch of a legacy kernel: ``kernel[g0, g1, ...]`` runs one program per grid
point, serially as nested loops on one NeuronCore (general/nki/programming_model.rst, "SPMD
programming model"), each reading its coordinates with ``nl.program_id``. ``shared_hbm``
outputs are shared by all programs: the n-th one a program creates is the n-th the first
program created, as the core allocator shares them between the logical cores of a launch.

It also keeps what the SDK's tracing of loops implies for direct allocation: the SDK does
not unroll ``affine_range``/``sequential_range`` loops while tracing a kernel ("Unlike
affine_range or sequential_range, Neuron compiler will fully unroll the loop during NKI
kernel tracing", general/nki/api/nki/language/__init__.py@0521004c, ``static_range``), so it
runs their body once, and a tensor placed inside one takes the address its arguments have
then: a kernel may advance an address counter in the body (nki-samples@0898a77
``allocated_fused_self_attn_for_SD_small_head_size`` does, ``cur_addr += ...``) and every
iteration still uses the same tiles. The simulator runs every iteration, so
:func:`traced_placement` gives a placement made in a later iteration the one the same call
site made in the first."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from asickernels.simulate.nki import errors, runtime


@dataclasses.dataclass(eq=False)
class _Loop:
    """An ``affine_range``/``sequential_range`` loop running: its iteration, and how often
    each call site placed a tensor in this iteration."""

    iteration: int = 0
    placed: dict[Any, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Launch:
    """One kernel launch in progress."""

    code: types.CodeType | None  # the kernel function's code: its frame is the top level
    grid: tuple[int, ...]
    program: tuple[int, ...] = ()
    loops: list[_Loop] = dataclasses.field(default_factory=list)  # innermost last
    # (call site, occurrence in the innermost loop's iteration) -> the first placement
    placements: dict[Any, Any] = dataclasses.field(default_factory=dict)


_launch: Launch | None = None


def _active(api: str) -> Launch:
    if _launch is None:
        raise errors.NkiApiOutsideOfNkiKernel(f"'{api}' was called outside an NKI kernel")
    return _launch


def programs(code: types.CodeType | None, grid: tuple[int, ...]) -> Iterator[None]:
    """Sets up the launch and steps through its programs (row-major grid order) in the
    active run."""
    global _launch
    run = runtime.active_run("kernel")
    for size in grid:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"SPMD launch grid sizes must be positive integers, got {grid}")
    _launch = Launch(code, grid)
    try:
        for program in itertools.product(*(range(size) for size in grid)):
            _launch.program = program
            run.shared_hbm_created = 0  # its n-th shared_hbm tensor is the launch's n-th
            yield
    finally:
        _launch = None


def traced_loop(values: Iterable[int]) -> Iterator[int]:
    """The iterations of an ``affine_range``/``sequential_range`` loop, recorded so that
    :func:`traced_placement` knows which are past the first."""
    launch = _launch
    if launch is None:  # outside a kernel: a plain loop
        yield from values
        return
    loop = _Loop()
    launch.loops.append(loop)
    try:
        for iteration, value in enumerate(values):
            loop.iteration = iteration
            loop.placed.clear()
            yield value
    finally:
        launch.loops.remove(loop)
        if not launch.loops:
            launch.placements.clear()


T = TypeVar("T")


def traced_placement(place: Callable[[], T]) -> T:
    """``place()``, the placements of a tensor the kernel allocates directly, unless this
    call site already placed one in an earlier iteration of the enclosing
    ``affine_range``/``sequential_range`` loops: then those placements (the SDK traces the
    loop body once; see the module docstring)."""
    launch = _launch
    if launch is None or not launch.loops:
        return place()
    site = _call_site(launch.code)
    innermost = launch.loops[-1]
    occurrence = innermost.placed.get(site, 0)
    innermost.placed[site] = occurrence + 1
    key = (site, occurrence)
    if key in launch.placements and any(loop.iteration for loop in launch.loops):
        return launch.placements[key]  # type: ignore[no-any-return]
    placed = place()
    launch.placements.setdefault(key, placed)
    return placed


def _call_site(kernel: types.CodeType | None) -> tuple[tuple[types.CodeType, int], ...]:
    """Where the kernel's code is now: each frame's code and instruction from the caller of
    the simulator up to the kernel function (simulator frames left out)."""
    frame = sys._getframe(1)
    site = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_SIMULATOR):
            site.append((code, frame.f_lasti))
            if code is kernel:
                break
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(site)


_SIMULATOR = os.path.dirname(os.path.dirname(__file__))  # asickernels/simulate/nki


def kernel_code() -> types.CodeType | None:
    return None if _launch is None else _launch.code


def program_id(axis: int) -> int:
    launch = _active("program_id")
    if not 0 <= int(axis) < len(launch.grid):
        raise ValueError(f"program_id({axis}) in a launch grid of {len(launch.grid)} dimension(s)")
    return launch.program[int(axis)]


def num_programs(axes: Any = None) -> int:
    launch = _active("num_programs")
    if axes is None:
        return math.prod(launch.grid)
    listed = axes if isinstance(axes, (tuple, list)) else [axes]
    return math.prod(launch.grid[int(a)] for a in listed)


def program_ndim() -> int:
    return len(_active("program_ndim").grid)
