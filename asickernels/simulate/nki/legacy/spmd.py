"""The SPMD launch of a legacy kernel: ``kernel[g0, g1, ...]`` runs one program per grid
point, serially as nested loops on one NeuronCore (general/nki/programming_model.rst, "SPMD
programming model"), each reading its coordinates with ``nl.program_id``. ``shared_hbm``
outputs are shared by all programs: the n-th one a program creates is the n-th the first
program created, as the core allocator shares them between the logical cores of a launch."""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from collections.abc import Iterator
from typing import Any

from asickernels.simulate.nki import errors, runtime


@dataclasses.dataclass
class Launch:
    """One kernel launch in progress."""

    code: types.CodeType | None  # the kernel function's code: its frame is the top level
    grid: tuple[int, ...]
    program: tuple[int, ...] = ()


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
