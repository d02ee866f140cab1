"""Every op's cases, gathered from the cases modules beside the declarations
(``kernels/<op>_cases.py``, every module of this package whose name ends in ``_cases``;
see :mod:`asickernels.kernels.cases`): what ``check``/``bench``, the TPU compile gate, the
NKI estimates and the tests iterate over. Nothing lists them: a new op's cases module is
found by its name."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from asickernels import kernels
from asickernels.kernels.cases import CompileShape, NkiEstimate, Workload
from asickernels.kernels.public import OPS

# In the order of OPS (of each module's first workload).
CASE_MODULES = tuple(
    sorted(
        (
            importlib.import_module(f"{kernels.__name__}.{module.name}")
            for module in pkgutil.iter_modules(kernels.__path__)
            if module.name.endswith("_cases")
        ),
        key=lambda module: min(OPS.index(workload.op) for workload in module.WORKLOADS),
    )
)

# By public function name, in the order of OPS.
WORKLOADS: dict[str, Workload] = {
    workload.name: workload
    for op in OPS
    for module in CASE_MODULES
    for workload in module.WORKLOADS
    if workload.op is op
}
COMPILE_SHAPES: tuple[CompileShape, ...] = tuple(
    shape for module in CASE_MODULES for shape in module.COMPILE_SHAPES
)
NKI_ESTIMATES: tuple[NkiEstimate, ...] = tuple(
    row for module in CASE_MODULES for row in module.NKI_ESTIMATES
)


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """Every op's example arguments, by op name: each cases module's ``examples(batch)``
    (valid, every parameter given, the optional ones off their defaults; see
    :mod:`asickernels.kernels.cases`)."""
    return {name: args for module in CASE_MODULES for name, args in module.examples(batch).items()}
