"""Which NKI the kernels are written against and run on: the Neuron SDK's ``nki`` (or
``neuronxcc.nki``) whenever it imports, otherwise asickernels' simulator, which has the same
names and signatures. The kernel modules import ``nki``, ``nl`` and ``nisa`` from here."""

from __future__ import annotations

import contextlib
import contextvars
import glob
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "USING_SDK",
    "float_input",
    "has_device",
    "last_counters",
    "nisa",
    "nki",
    "nl",
    "run",
]


def _import_sdk() -> tuple[Any, Any, Any] | None:
    """``(nki, nki.language, nki.isa)`` of an installed Neuron SDK with the current API
    (``nki.simulate``, instructions taking ``dst`` first), or None. PyPI's placeholder
    packages raise on import and count as absent."""
    for name in ("nki", "neuronxcc.nki"):
        try:
            module = importlib.import_module(name)
            if module.__name__.startswith("asickernels."):
                continue  # the simulator, aliased as ``nki`` by simulate.nki.install()
            if not hasattr(module, "simulate"):
                continue  # the legacy API (Neuron <= 2.26), which these kernels do not use
            return (
                module,
                importlib.import_module(f"{name}.language"),
                importlib.import_module(f"{name}.isa"),
            )
        except Exception:  # placeholders raise ImportError, or worse
            continue
    return None


_SDK = _import_sdk()
USING_SDK = _SDK is not None
nki: Any
nl: Any
nisa: Any
if _SDK is not None:
    nki, nl, nisa = _SDK
else:
    from asickernels.simulate import nki
    from asickernels.simulate.nki import isa as nisa
    from asickernels.simulate.nki import language as nl


def has_device() -> bool:
    """A Neuron device is attached (the driver exposes ``/dev/neuron*``)."""
    return bool(glob.glob("/dev/neuron*"))


KernelObserver = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], None]
_observer: contextvars.ContextVar[KernelObserver | None] = contextvars.ContextVar(
    "nki_kernel_observer", default=None
)


@contextlib.contextmanager
def observing_kernels(observer: KernelObserver) -> Iterator[None]:
    """Within this block, every kernel :func:`run` launches is first shown to ``observer``
    as ``(kernel, args, kwargs)`` (how ``bench`` times the kernels with ``nki.benchmark``)."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


def run(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs an ``nki.jit`` kernel on numpy arrays: on the device when there is one, else in
    the SDK's simulator (when the SDK is installed) or ours."""
    observer = _observer.get()
    if observer is not None:
        observer(kernel, args, kwargs)
    if USING_SDK and not has_device():
        return nki.simulate(kernel)(*args, **kwargs)
    return kernel(*args, **kwargs)


def last_counters() -> dict[str, float]:
    """Our simulator's counters for its last kernel run (none when the SDK runs kernels)."""
    return {} if USING_SDK else nki.last_counters()


# The float dtypes NKI has (no float64).
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def float_input(values: np.ndarray) -> np.ndarray:
    """A float array in a dtype NKI has: float64 becomes float32 (the kernels compute in
    float32), the others pass as they are."""
    return values if values.dtype in FLOAT_DTYPES else values.astype(np.float32)
