"""``neuronxcc.nki.compiler``: compiler directives (general/nki/api/nki/compiler/ at
aws-neuron-sdk 0521004c). Those that only steer optimisation leave a kernel's results
unchanged and are accepted as no-ops; direct allocation (``sbuf.mod_alloc``, ...) places
tensors at explicit addresses, which the simulator does not model, so it raises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asickernels.simulate.nki.tensor import MemoryRegion


def _directive(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    return func if func is not None else (lambda function: function)


skip_middle_end_transformations = _directive
force_auto_alloc = _directive
enable_stack_allocator = _directive


class Directive:
    """A scheduling directive for ``nl.sequential_range(..., directives=...)``; the simulator
    runs every instruction in program order, which satisfies each of them."""

    def __init__(self, kind: str, **options: Any) -> None:
        self.kind = kind
        self.options = options


def no_reorder() -> Directive:
    """Keeps the loop's operations in program order."""
    return Directive("no_reorder")


def multi_buffer(factor: int = 2) -> Directive:
    """Allocates ``factor`` buffers for the loop's tensors (placement only)."""
    return Directive("multi_buffer", factor=factor)


class _Buffer:
    """``nki.compiler.sbuf`` / ``psum``: automatic allocation is what the simulator does."""

    def __init__(self, region: MemoryRegion) -> None:
        self.region = region

    def auto_alloc(self) -> MemoryRegion:
        return self.region

    def mod_alloc(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"direct allocation (nki.compiler.{self.region.value}.mod_alloc) is not simulated; "
            f"allocate with buffer=nl.{self.region.value}"
        )

    alloc = mod_alloc


sbuf = _Buffer(MemoryRegion.sbuf)
psum = _Buffer(MemoryRegion.psum)
