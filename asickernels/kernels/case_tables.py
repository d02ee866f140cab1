"""Every op's cases, gathered from the cases modules beside the declarations
(``kernels/<op>_cases.py``; see :mod:`asickernels.kernels.cases`): what ``check``/``bench``,
the TPU compile gate, the NKI estimates and the tests iterate over. A new op's cases module
is added to :data:`CASE_MODULES`, and nothing else lists its cases."""

from __future__ import annotations

from typing import Any

from asickernels.kernels import (
    box_iou_cases,
    giou_cases,
    int8_matmul_cases,
    linear_sum_assignment_cases,
    nms_cases,
    roi_cases,
)
from asickernels.kernels.cases import CompileShape, NkiEstimate, Workload

CASE_MODULES = (
    giou_cases,
    int8_matmul_cases,
    box_iou_cases,
    roi_cases,
    nms_cases,
    linear_sum_assignment_cases,
)

# By public function name, in the order of CASE_MODULES.
WORKLOADS: dict[str, Workload] = {
    workload.name: workload for module in CASE_MODULES for workload in module.WORKLOADS
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
