"""``nki.compiler.CompileConfig``, ``SpecializationConfig`` and their enums (NKI 0.8): the
per-kernel configuration ``@nki.jit(compile_config=..., specialization_config=...)`` takes.

Pages (awsdocs-neuron.readthedocs-hosted.com/en/latest/, NKI 0.8; v2.33.1 lists
CompileConfig, SpecializationConfig and AddressRotation): nki/api/generated/nki.compiler.
{CompileConfig, SpecializationConfig, Allocation, AllocationMode, SchedulingHeuristic,
OptLevel, AddressRotation}.html; nki/reference/nki-compile-config-ref.html (the options);
nki/deep-dives/nki-compile-config-tshoot.html ("Configuration errors", the checks below).

Every option chooses how the compiler allocates memory and orders instructions, which the
simulator does its own way (program order, live tensors counted against capacity), so a
kernel's results do not depend on them. The checks the troubleshooting page lists as raised
"before compilation" are made: enum options take a member of their enum (TypeError),
``scheduling=True`` needs ``allocation=Allocation.LINEAR`` (ValueError), and a kernel called
from another kernel must not set a config that disagrees with the top-level kernel's
(``NkiValidationError``; a warning when the top-level kernel's ``SpecializationConfig`` has
``allow_nested_config_override=True``). The page's other checks (options acting only under
NKI allocation or scheduling) are not made: which options they cover is not readable in the
pages at hand, and refusing a config the compiler accepts would stop a kernel that runs.
"""

from __future__ import annotations

import enum
import warnings
from typing import Any, ClassVar

from asickernels.simulate.nki import errors

__all__ = [
    "AddressRotation",
    "Allocation",
    "AllocationMode",
    "CompileConfig",
    "OptLevel",
    "SchedulingHeuristic",
    "SpecializationConfig",
]


class Allocation(enum.Enum):
    """How tiles get addresses: COLORING (the current flow, graph coloring after tracing)
    or LINEAR (NKI's linear scan before the rest of compilation)."""

    COLORING = "coloring"
    LINEAR = "linear"


class AllocationMode(enum.Enum):
    """How LINEAR allocation picks an address (``experimental_allocation_mode``)."""

    RING = "ring"
    FAST = "fast"
    MAX_REUSE = "max_reuse"


class SchedulingHeuristic(enum.Enum):
    """Which ready instruction NKI scheduling takes next
    (``experimental_scheduling_heuristic``); ASAP is the default."""

    ASAP = "asap"
    CRITICAL_PATH = "critical_path"
    DMA_PREFETCH = "dma_prefetch"
    TRIVIAL = "trivial"


class OptLevel(enum.Enum):
    """How many optimizations the new flow applies; O1 is the default."""

    O0 = 0
    O1 = 1
    O2 = 2


class AddressRotation(enum.Enum):
    """Whether the backend may rotate a memloc's address; AUTO is the default."""

    AUTO = "auto"
    ENABLE = "enable"
    DISABLE = "disable"


# option -> (enum it takes, whether None is allowed); the TypeError rows of the
# troubleshooting page
_ENUM_OPTIONS: dict[str, tuple[type[enum.Enum], bool]] = {
    "allocation": (Allocation, False),
    "opt_level": (OptLevel, False),
    "experimental_allocation_mode": (AllocationMode, True),
    "experimental_scheduling_heuristic": (SchedulingHeuristic, True),
    "address_rotation": (AddressRotation, False),
}

# The options the reference pages name, with their defaults where the pages give one
# (Allocation: COLORING is "the current flow"; OptLevel: O1 "(default)"; AddressRotation:
# AUTO "(default)"; nki_alloc_fallback: "On by default"); the rest are off.
_DEFAULTS: dict[str, Any] = {
    "allocation": Allocation.COLORING,
    "scheduling": False,
    "opt_level": OptLevel.O1,
    "experimental_allocation_mode": None,
    "experimental_scheduling_heuristic": None,
    "address_rotation": AddressRotation.AUTO,
    "barrier_check": False,
    "dead_code_elim": False,
    "dma_copy_elim": False,
    "element_widening": False,
    "engine_balancing": False,
    "nki_alloc_fallback": True,
    "non_ssa_legalization": False,
    "prefetch_auto": False,
    "register_load_reuse": False,
    "remove_overwritten_writes": False,
    "remove_unused_instructions": False,
    "sbuf_allocation_fallback": False,
    "split_reused_buffers": False,
    "tensor_copy_elim": False,
}


class _Config:
    """Options as attributes: the class holds each default (the reference documents them as
    class attributes), an instance the values it was given."""

    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls) -> None:
        for key, default in cls._defaults.items():
            setattr(cls, key, default)

    def __init__(self, **options: Any) -> None:
        name = type(self).__name__
        for key in options:
            if key not in self._defaults:
                raise TypeError(f"nki.compiler.{name} has no option {key!r}")
        self._set = dict(options)
        for key, default in self._defaults.items():
            setattr(self, key, options.get(key, default))

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, key) for key in self._defaults)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        given = ", ".join(f"{key}={value!r}" for key, value in self._set.items())
        return f"{type(self).__name__}({given})"


class CompileConfig(_Config):
    """Per-kernel compile options (``@nki.jit(compile_config=CompileConfig(...))``); no
    effect on a kernel's results here (module docstring)."""

    _defaults: ClassVar[dict[str, Any]] = _DEFAULTS

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for key, (kind, optional) in _ENUM_OPTIONS.items():
            value = getattr(self, key)
            if not isinstance(value, kind) and not (optional and value is None):
                allowed = f"an nki.compiler.{kind.__name__}" + (" or None" if optional else "")
                raise TypeError(f"{key} must be {allowed}, got {value!r}")
        allocation = getattr(self, "allocation")  # noqa: B009 (set from _defaults)
        if getattr(self, "scheduling") and allocation is not Allocation.LINEAR:  # noqa: B009
            raise ValueError(
                "scheduling=True needs allocation=Allocation.LINEAR, got "
                f"allocation={allocation} (nki-compile-config-tshoot, 'Configuration errors')"
            )


class SpecializationConfig(_Config):
    """Options of the specialization phase (``@nki.jit(specialization_config=...)``)."""

    _defaults: ClassVar[dict[str, Any]] = {"allow_nested_config_override": False}


def check_jit_options(options: dict[str, Any]) -> None:
    """The types ``nki.jit`` checks before compilation."""
    for key, kind in (
        ("compile_config", CompileConfig),
        ("specialization_config", SpecializationConfig),
    ):
        value = options.get(key)
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"nki.jit({key}=...) takes an nki.compiler.{kind.__name__}")


def check_nested(
    name: str,
    nested: CompileConfig | None,
    top: CompileConfig | None,
    specialization: SpecializationConfig | None,
) -> None:
    """A kernel called from inside another is inlined under the top-level kernel's config; a
    config of its own that disagrees is refused unless the top-level kernel allows it."""
    if nested is None or nested == (top if top is not None else CompileConfig()):
        return
    message = (
        f"Kernel '{name}' is called from inside another kernel but sets compile config "
        f"{nested!r}, which differs from the top-level kernel's {top!r}"
    )
    if specialization is not None and getattr(specialization, "allow_nested_config_override"):  # noqa: B009
        warnings.warn(message + "; it is inlined under the top-level config", stacklevel=3)
        return
    raise errors.NkiValidationError(message)
