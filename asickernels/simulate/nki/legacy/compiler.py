"""``neuronxcc.nki.compiler``: the same API as the current ``nki.compiler``
(:mod:`asickernels.simulate.nki.compiler`); the legacy generation places each logical tile
of a tensor's block dimensions (``nl.par_dim``) and traces a loop body once
(:func:`asickernels.simulate.nki.legacy.spmd.traced_placement`)."""

from asickernels.simulate.nki.compiler import (
    DirectAllocation,
    Directive,
    enable_stack_allocator,
    force_auto_alloc,
    multi_buffer,
    no_reorder,
    psum,
    sbuf,
    skip_middle_end_transformations,
)

__all__ = [
    "DirectAllocation",
    "Directive",
    "enable_stack_allocator",
    "force_auto_alloc",
    "multi_buffer",
    "no_reorder",
    "psum",
    "sbuf",
    "skip_middle_end_transformations",
]
