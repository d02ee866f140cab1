"""An opt-in import hook: ``import nki...`` and ``import neuronxcc.nki...`` resolve to the
simulator on machines without the Neuron SDK, so kernel code runs unchanged::

    from asickernels.simulate import nki
    nki.install.install()            # or: python -m asickernels.simulate.nki script.py
    import neuronxcc.nki.language as nl   # asickernels.simulate.nki.legacy.language

``nki`` (the current API, Neuron 2.27+) maps to :mod:`asickernels.simulate.nki`,
``neuronxcc.nki`` (Neuron 2.2x) to :mod:`asickernels.simulate.nki.legacy`, submodules
alike. A real SDK always wins: a top-level package is hooked only when it cannot be found
or its API module fails to import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

# The packages the hook can provide: import name -> (the simulator module it becomes, the
# module a real SDK must import for it to count as present).
ALIASES = {
    "nki": "asickernels.simulate.nki",
    "neuronxcc.nki": "asickernels.simulate.nki.legacy",
}
_REAL_API = {"nki": "nki", "neuronxcc": "neuronxcc.nki"}


class _AliasLoader(importlib.abc.Loader):
    """Loads a name as an existing module (a simulator module, or an empty namespace)."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.own_spec = getattr(module, "__spec__", None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is already executed; importlib has just set its ``__spec__`` to the
        alias's, so the module gets its own back (reloads and ``-m`` keep working)."""
        if self.own_spec is not None:
            module.__spec__ = self.own_spec


class SimulatorFinder(importlib.abc.MetaPathFinder):
    """Resolves the hooked top-level packages and their submodules to the simulator."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)
        self.provided: list[str] = []  # names this finder put into sys.modules

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.roots:
            return None
        module = _simulator_module(fullname)
        if module is None:
            return None
        self.provided.append(fullname)
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(module), is_package=hasattr(module, "__path__")
        )


def _simulator_module(fullname: str) -> types.ModuleType | None:
    """The simulator module behind ``fullname`` (None: no such module)."""
    if fullname == "neuronxcc":  # a plain namespace holding ``nki``
        namespace = types.ModuleType("neuronxcc", "neuronxcc on the asickernels simulator")
        namespace.__path__ = []
        return namespace
    for alias, target in ALIASES.items():
        if fullname == alias or fullname.startswith(alias + "."):
            name = target + fullname[len(alias) :]
            if importlib.util.find_spec(name) is None:
                return None
            return importlib.import_module(name)
    return None


_finder: SimulatorFinder | None = None


def real_sdk_available(root: str) -> bool:
    """Whether a real ``nki`` / ``neuronxcc`` is installed and its API module imports."""
    if _finder is not None and root in _finder.roots:
        return False
    if importlib.util.find_spec(root) is None:
        return False
    try:
        importlib.import_module(_REAL_API[root])
    except Exception:  # a broken or placeholder SDK counts as absent
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
        return False
    return True


def install() -> tuple[str, ...]:
    """Hooks ``nki`` and ``neuronxcc`` where no real SDK imports; returns the hooked
    top-level names (empty when both SDK generations are really installed). Idempotent."""
    global _finder
    if _finder is not None:
        return _finder.roots
    roots = tuple(root for root in _REAL_API if not real_sdk_available(root))
    if roots:
        _finder = SimulatorFinder(roots)
        sys.meta_path.insert(0, _finder)
    return roots


def uninstall() -> None:
    """Removes the hook and the module names it provided."""
    global _finder
    if _finder is None:
        return
    sys.meta_path.remove(_finder)
    for name in _finder.provided:
        sys.modules.pop(name, None)
    _finder = None


def installed() -> tuple[str, ...]:
    """The top-level names currently hooked."""
    return () if _finder is None else _finder.roots
