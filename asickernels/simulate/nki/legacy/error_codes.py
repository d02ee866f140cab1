"""Error codes of the legacy API that the core simulator has no class for
(general/nki/api/nki.errors.rst at aws-neuron-sdk 0521004c); the shared ones are
:mod:`asickernels.simulate.nki.errors`, which these extend."""

from __future__ import annotations

from asickernels.simulate.nki.errors import NkiValidationError


class Err1dArangeNotSupported(NkiValidationError):
    """A 1-D ``nl.arange`` used as an index: lift it with ``[:, None]`` or ``[None, :]``."""

    code = "err_1d_arange_not_supported"


class ErrSharedHbmMustInKernelLevel(NkiValidationError):
    """``shared_hbm`` tensors can only be created at the kernel's top-level scope."""

    code = "err_shared_hbm_must_in_kernel_level"


class ErrUnsupportedMixingBasicAdvancedTensorIndexing(NkiValidationError):
    """Slices (basic indexing) and index grids (advanced indexing) in one index."""

    code = "err_unsupported_mixing_basic_advanced_tensor_indexing"


class ErrControlFlowConditionDependingOnArange(NkiValidationError):
    """Python control flow (``if``, ``and``, ``or``) on an ``nl.arange``/``nl.mgrid``
    comparison: use it as ``mask=`` (combined with ``&``)."""

    code = "err_control_flow_condition_depending_on_arange"


class ErrCannotAssignToIndex(NkiValidationError):
    """Item assignment into an index grid (``nisa.iota`` makes a writable tile)."""

    code = "err_cannot_assign_to_index"


class ErrCannotUpdateImmutableParameter(NkiValidationError):
    """A ``nki.jit`` kernel writes a parameter not annotated ``nt.mutable_tensor``."""

    code = "err_cannot_update_immutable_parameter"


class ErrMutableParameterNotReturned(NkiValidationError):
    """An ``nt.mutable_tensor`` parameter is missing from the kernel's return values."""

    code = "err_mutable_parameter_not_returned"


class ErrNestedKernelWithSpmdGrid(NkiValidationError):
    """A kernel launched with an SPMD grid from inside another kernel."""

    code = "err_nested_kernel_with_spmd_grid"
