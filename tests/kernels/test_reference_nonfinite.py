"""The float64 references take NaN and infinite inputs as every backend does, with IEEE results
(or a ValueError where the op refuses them) and no numpy ``RuntimeWarning``: a user's NaN
boxes never make our own code warn."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

import asickernels
from asickernels.kernels import case_tables

NO_BACKEND = {"quantize_int8"}  # plain JAX: no reference of its own


def _spoiled(args: dict, value: float) -> dict:
    """``args`` with the first element of each float array set to ``value`` (copies)."""
    spoiled = {}
    for name, array in args.items():
        if isinstance(array, np.ndarray) and array.dtype.kind == "f" and array.size:
            array = array.copy()
            array.flat[0] = value
        spoiled[name] = array
    return spoiled


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("op", sorted(set(case_tables.examples()) - NO_BACKEND), ids=str)
def test_the_reference_warns_of_no_nonfinite_input(op, value):
    args = _spoiled(case_tables.examples()[op], value)
    # A ValueError is a refusal naming the argument (RoI image indices, LSA costs).
    with warnings.catch_warnings(), contextlib.suppress(ValueError):
        warnings.simplefilter("error", RuntimeWarning)
        getattr(asickernels, op)(**args, backend="reference")
