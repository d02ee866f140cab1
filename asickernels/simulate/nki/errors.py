"""The rules the simulator enforces, one exception class each.

Every class carries ``code``: the Neuron SDK's error code (``err_...``, from the NKI error
reference) where the SDK has one for the rule; rules the SDK leaves to its allocator or
documents without a code (SBUF/PSUM capacity, matmul dtypes, reduction axes) get a code in
the same style, marked "not an SDK code" below. All derive from
:class:`NkiValidationError`, the name ``nki.isa`` gives hardware-constraint errors.
"""

from __future__ import annotations

from typing import ClassVar


class NkiValidationError(Exception):
    """A kernel broke a hardware rule. The message starts with the rule's ``code``."""

    code: ClassVar[str] = "err_nki_validation"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")


class NumPartitionExceedArchLimit(NkiValidationError):
    """An on-chip tile's partition dimension (its first axis) exceeds 128."""

    code = "err_num_partition_exceed_arch_limit"


class NumPartitionMismatch(NkiValidationError):
    """Operands of one instruction span different numbers of partitions (for a matmul: the
    stationary and moving contraction sizes differ)."""

    code = "err_num_partition_mismatch"


class SizeOfDimensionExceedArchLimit(NkiValidationError):
    """A free dimension exceeds an engine limit: a PSUM tile larger than one 2 KiB bank per
    partition, a matmul stationary free size > 128 or moving free size > 512."""

    code = "err_size_of_dimension_exceed_arch_limit"


class LeadingDimensionOfTensorMustBePartition(NkiValidationError):
    """An on-chip tile without a partition axis (fewer than 2 dimensions), or a view that
    would move, broadcast or insert a dimension in front of the partition axis."""

    code = "err_leading_dimension_of_tensor_must_be_partition"


class UnsupportedMemory(NkiValidationError):
    """An operand is in the wrong memory: ``load`` from anything but HBM, ``store`` to
    anything but HBM, compute on HBM, matmul inputs outside SBUF or output outside PSUM,
    GpSimd touching PSUM, both ``tensor_tensor`` inputs in PSUM, a kernel returning a tile."""

    code = "err_unsupported_memory"


class TensorAccessOutOfBound(NkiValidationError):
    """An index or slice reaches outside the tensor (nothing is clipped silently)."""

    code = "err_tensor_access_out_of_bound"


class InvalidAddress(NkiValidationError):
    """A tensor placed at an address the hardware cannot start it at: a first partition
    the ISA does not allow for its partition count, a PSUM tensor not starting at a bank,
    or a legacy allocation function outside its documented range (not an SDK code)."""

    code = "err_invalid_address"


class StoreDstShapeSmallerThanOtherShape(NkiValidationError):
    """An instruction writes into a broadcast view, i.e. several values into one element."""

    code = "err_store_dst_shape_smaller_than_other_shape"


class AmbiguousTensorTruthValue(NkiValidationError):
    """Python control flow on a legacy tile's value (``if tile:``): values exist only on
    device."""

    code = "err_ambiguous_tensor_truth_value"


class NkiApiOutsideOfNkiKernel(NkiValidationError):
    """An NKI API was called outside a running kernel."""

    code = "err_nki_api_outside_of_nki_kernel"


class HbmTensorWithInitValueNotSupported(NkiValidationError):
    """``zeros``/``full``/``ones`` asked for an HBM tensor."""

    code = "err_hbm_tensor_with_init_value_not_supported"


class SbufCapacityExceeded(NkiValidationError):
    """Live SBUF allocations exceed the target's bytes per partition (not an SDK code; the
    compiler's allocator reports it)."""

    code = "err_sbuf_capacity_exceeded"


class PsumCapacityExceeded(NkiValidationError):
    """More live PSUM tiles than the 8 banks of 2 KiB per partition (not an SDK code)."""

    code = "err_psum_capacity_exceeded"


class OnChipOutputWarning(UserWarning):
    """A legacy kernel returned an SBUF/PSUM tile: the SDK's simulator returns its values,
    a device accepts only HBM outputs."""


class BroadcastOperandWarning(UserWarning):
    """A legacy instruction repeated a ``[P, 1]`` operand along the free axes, which AWS's
    kernels rely on and the reference does not document."""


class SpillWarning(UserWarning):
    """Live tiles exceed SBUF or PSUM: the compiler spills them to HBM rather than failing
    (nki-samples attention.py@8370e11, flash_attn_bwd: "we will have psum spilling in the
    current implementation"; the current API's kernel-optimization tutorial, whose v4 needs
    more SBUF than trn2 has, aws-neuron-sdk@81ce03a)."""


class DeviceRanItWarning(UserWarning):
    """Code a documented rule forbids but that published kernels ran on a Neuron device: the
    simulator runs it as the device did and names both the rule and the device-run code."""


class DeprecatedApiWarning(FutureWarning):
    """An API of the ``nki`` namespace that a later NKI release deprecated or removed: it runs
    as the release the code was written for ran it, and the message names the release that
    deprecated (and, if any, removed) it and what replaces it. The releases come from
    ``reference.json`` (:mod:`asickernels.simulate.nki.reference`). A ``FutureWarning``, so
    that users see it by default."""


class CollectiveMismatch(NkiValidationError):
    """The cores meeting in one collective, ``sendrecv`` or ``core_barrier`` (the n-th on
    each, in program order) made different calls: another operation, other sizes or dtypes,
    another replica group or peer. On a device this hangs or corrupts data; the message
    names each core and its call (not an SDK code)."""

    code = "err_collective_mismatch"


class CollectiveDeadlock(NkiValidationError):
    """Every core still running waits in a collective, ``sendrecv`` or ``core_barrier`` that
    cannot complete: a peer finished the kernel without reaching it, or the cores wait for
    each other in different ones. The message names each waiting core, its call and where
    its missing peers are (not an SDK code)."""

    code = "err_collective_deadlock"


class UnsupportedDtype(NkiValidationError):
    """A dtype the hardware path cannot take: int8 (or any integer) on the Tensor Engine, fp32
    mixed with a 16-bit matmul operand, a matmul result other than fp32, a non-NKI dtype such
    as float64, a non-fp32 tensor-scalar operand, a predicate that is not unsigned (not an
    SDK code)."""

    code = "err_unsupported_dtype"


class UnsupportedReduceAxis(NkiValidationError):
    """A reduction over the partition axis, or over free axes that are not the trailing ones
    (not an SDK code)."""

    code = "err_unsupported_reduce_axis"


class ShapeMismatch(NkiValidationError):
    """Operand shapes disagree (elements per partition, matmul output shape, a reshape the
    layout cannot express) (not an SDK code)."""

    code = "err_shape_mismatch"


class UnsupportedOperator(NkiValidationError):
    """An ALU operator the instruction does not have (not an SDK code)."""

    code = "err_unsupported_operator"


class ExceedMaxSupportedDimension(NkiValidationError):
    """A tensor has more dimensions than the instruction takes (matmul operands are 2-D)."""

    code = "err_exceed_max_supported_dimension"


class UnsupportedEngine(NkiValidationError):
    """An instruction asked for an engine that cannot run it (not an SDK code)."""

    code = "err_unsupported_engine"


# -- Codes only the legacy generation (``neuronxcc.nki``) raises
# (general/nki/api/nki.errors.rst at aws-neuron-sdk 0521004c).
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


# The legacy generation's own rules (tests/simulate/nki/test_nki_legacy.py plants them).
# A current-API tensor's truth value is a presence test (NkiTensor.__bool__).
LEGACY_RULES = (
    AmbiguousTensorTruthValue,
    Err1dArangeNotSupported,
    ErrSharedHbmMustInKernelLevel,
    ErrUnsupportedMixingBasicAdvancedTensorIndexing,
    ErrControlFlowConditionDependingOnArange,
    ErrCannotAssignToIndex,
    ErrCannotUpdateImmutableParameter,
    ErrMutableParameterNotReturned,
    ErrNestedKernelWithSpmdGrid,
)

# Rules between cores and ranks (tests/simulate/nki/test_nki_collectives.py plants them).
COLLECTIVE_RULES = (CollectiveMismatch, CollectiveDeadlock)
