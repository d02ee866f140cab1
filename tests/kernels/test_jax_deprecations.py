"""Our calls use no jax API that the installed jax deprecates: run in every environment, so
the newest jax's tier (Makefile: test-jax-latest) names what a new release deprecates."""

from __future__ import annotations

import warnings

import pytest

import asickernels
from asickernels.kernels import case_tables

EXAMPLES = case_tables.examples()


# backend=None: jitted kernels; "reference": a host (numpy) kernel, outputs handed to jax.
@pytest.mark.parametrize("backend", [None, "reference"])
@pytest.mark.parametrize("op", sorted(set(EXAMPLES) - {"quantize_int8"}))  # plain JAX
def test_an_eager_call_warns_of_nothing_deprecated(op, backend):
    with warnings.catch_warnings():
        # Warnings jax attributes to our code (its deprecations name the caller).
        warnings.filterwarnings("error", category=DeprecationWarning, module="asickernels")
        getattr(asickernels, op)(**EXAMPLES[op], backend=backend)
