"""The front of every op: the route lookup each repeated eager call starts with.

An op (:class:`asickernels.kernels.declaration.Op`) subclasses :data:`Front`. A call whose
arguments have a numpy key (:func:`python_numpy_key`) that names an earlier call's route
runs that route with its positional arguments; anything else goes to the op's
``_miss(numpy_key, args, kwargs)``, which binds, validates, runs, and may store a route
under the key. Between two XLA calls the interpreter runs with cold caches, and building
that key in Python cost 3-5 µs of a 15-30 µs small call, so :data:`Front` is a C type
(``csrc/eager_front.cpp``), built on first import with the compiler the native CPU kernels
use and cached like them. It also holds :data:`InPlaceCall`. Where it cannot be built (no C++ compiler, no Python headers),
or with ``ASICKERNELS_EAGER_FRONT=python`` set, :class:`PythonFront` does the same in
Python: :data:`FRONT_KIND` and :data:`UNAVAILABLE_REASON` say which, and ``asickernels
info`` shows them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asickernels import _native_build

_SOURCE = Path(__file__).parent / "csrc" / "eager_front.cpp"
_MODULE = "asickernels_eager_front"
#: Set to "python" to use :class:`PythonFront` (the tests run both).
FRONT_ENV = "ASICKERNELS_EAGER_FRONT"
_FLAGS = ("-std=c++17", "-fPIC", "-shared", "-fno-strict-aliasing", "-Wall", "-Wextra")
_TYPE_SHAPE_AND_DTYPE = attrgetter("__class__", "shape", "dtype")


def python_numpy_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The route key of numpy arrays given by position, the other arguments by name: each
    positional argument's type (a JAX array or a tracer of the same shape must not match),
    shape and dtype, then the keyword items in the order given, then their values' types
    (True == 1 == 1.0 must not share a route). None when an argument has no shape or
    dtype, or the key cannot be hashed. The C front builds the same key."""
    try:
        key: Any = (
            (*map(_TYPE_SHAPE_AND_DTYPE, args), *kwargs.items(), *map(type, kwargs.values()))
            if kwargs
            else tuple(map(_TYPE_SHAPE_AND_DTYPE, args))
        )
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


class PythonFront:
    """:data:`Front` in Python, where the C one cannot be built."""

    _numpy_routes: dict[Any, Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = python_numpy_key(args, kwargs)
        route = self._numpy_routes.get(key) if key is not None else None
        if route is not None:
            return route(*args)
        return self._miss(key, args, kwargs)

    def _miss(self, numpy_key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


def _load_c_module() -> tuple[Any, str | None]:
    """The built C module, or None and why not."""
    if os.environ.get(FRONT_ENV) == "python":
        return None, f"{FRONT_ENV}=python"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return None, f"no Python headers ({include / 'Python.h'} is missing)"
    abi = sysconfig.get_config_var("SOABI") or "abi"
    try:  # numpy's C API: built against the installed numpy's headers
        path = _native_build.build(
            f"eager-front-{abi}-numpy-{np.__version__}",
            [_SOURCE],
            flags=_FLAGS,
            include_dirs=(include, Path(np.get_include())),
        )
    except _native_build.NativeBuildError as error:
        return None, str(error).splitlines()[0]
    loader = importlib.machinery.ExtensionFileLoader(_MODULE, str(path))
    spec = importlib.util.spec_from_file_location(_MODULE, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module, None


_c_module, UNAVAILABLE_REASON = _load_c_module()
#: "C" or "Python": which front the ops have.
FRONT_KIND = "Python" if _c_module is None else "C"
if TYPE_CHECKING:
    Front = PythonFront
else:  # the base class of every op
    Front = PythonFront if _c_module is None else _c_module.Front
#: The key Front builds (:func:`python_numpy_key` itself with the Python front).
numpy_key = python_numpy_key if _c_module is None else _c_module.numpy_key
#: ``InPlaceCall(function, fallback)``: a route calling ``function`` with a uint32 table of
#: its numpy arguments' addresses (each a pair, in this machine's byte order) and waiting
#: for the results, or ``fallback(*arrays)`` when an argument is not a C-contiguous numpy
#: array aligned for its dtype (:mod:`asickernels.backends.cpu.in_place`). None with the
#: Python front: such a route is worth having only where its call costs no Python.
InPlaceCall: Any = None if _c_module is None else _c_module.InPlaceCall
