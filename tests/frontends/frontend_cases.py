"""For the frontend tests: arguments for every op that exercise every parameter (a
frontend function called with them must return what the JAX op returns; they come from the
op's cases module), and the signature an SPMD wrapper must have."""

from __future__ import annotations

import inspect

from asickernels.frontends import sharded_ops
from asickernels.kernels import case_tables

# Every op has SPMD wrappers but those declared without a partition rule.
SHARDED_OPS = sharded_ops()


def every_argument(name: str, batch: tuple[int, ...] = ()) -> dict:
    """Valid arguments by name for op ``name`` with leading ``batch`` dims, every optional
    one given and set off its default: its cases module's ``examples`` (see
    :mod:`asickernels.kernels.cases`)."""
    return case_tables.examples(batch)[name]


def parameters(signature: inspect.Signature) -> list[tuple]:
    """What a caller sees of a signature: names, kinds and defaults (not annotations)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


REQUIRED = inspect.Parameter.empty
PARTITION_PARAMETERS = {  # the parameters each partition rule adds, with their defaults
    "batch": (("batch_spec", REQUIRED),),
    "loss": (("batch_spec", REQUIRED),),
    "matmul": (("m_axis", None), ("k_axis", None), ("n_axis", None)),
}


def sharded_signature(op, signature: inspect.Signature) -> list[tuple]:
    """A frontend's signature of ``op`` (names, kinds, defaults) with ``mesh`` and the
    partition parameters before its trailing ``backend`` (and ``config``)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = [("mesh", keyword, REQUIRED)] + [
        (name, keyword, default) for name, default in PARTITION_PARAMETERS[op.partition]
    ]
    own = parameters(signature)
    trailing = [p for p in own if p[0] in ("backend", "config")]
    return [p for p in own if p not in trailing] + added + trailing
