"""An opt-in import hook: ``import nki...`` and ``import neuronxcc.nki...`` resolve to the
simulator on machines without the Neuron SDK, so kernel code runs unchanged::

    from asickernels.simulate import nki
    nki.install.install()            # or: python -m asickernels.simulate.nki script.py
    import neuronxcc.nki.language as nl   # asickernels.simulate.nki.legacy.language

``nki`` (the current API, Neuron 2.27+) maps to :mod:`asickernels.simulate.nki`,
``neuronxcc.nki`` (Neuron 2.2x) to :mod:`asickernels.simulate.nki.legacy`, submodules
alike. Two more names let AWS's NKI kernel library (aws-neuron/nki-library) run its own test
suite in ``--test-mode simulation``: ``nki_cpu_simulator`` (AWS's CPU simulator package, whose
``nki_cpu_simulator.nki`` tree that suite aliases over ``nki``) is the same simulator, and
``neuron_dtypes`` (the SDK's host-side dtype library) is :mod:`.neuron_dtypes`. A real package
always wins: a top-level name is hooked only when it cannot be found or its API module fails
to import.
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
    "nki_cpu_simulator.nki": "asickernels.simulate.nki",
    "neuron_dtypes": "asickernels.simulate.nki.neuron_dtypes",
}
_REAL_API = {
    # not ``nki`` itself: a folder named nki on sys.path imports as a namespace package (pytest
    # puts test folders there, and tests/simulate holds one)
    "nki": "nki.language",
    "neuronxcc": "neuronxcc.nki",
    "nki_cpu_simulator": "nki_cpu_simulator.nki",
    "neuron_dtypes": "neuron_dtypes",
}
# Top-level names that are only a namespace holding the API package.
_NAMESPACES = ("neuronxcc", "nki_cpu_simulator")
# nki_cpu_simulator's modules the simulator keeps under another name: ``nki.language.dtypes``
# (what nki-library's test/utils/simulation_setup.py@d2ad3a5 aliases as ``nki.dtype``) is
# :mod:`.dtype`. The simulator's ``language`` is a module, not a package, so this child is bound
# (in ``sys.modules`` and as an attribute) when its parent is imported.
_CHILDREN = {"nki_cpu_simulator.nki.language": {"dtypes": "asickernels.simulate.nki.dtype"}}
# nki_cpu_simulator's module that simulation_setup.py imports (as ``builtins.builtin``) and
# nki-library never uses: empty, the simulator having no module of that name.
_UNUSED = ("nki_cpu_simulator.nki.builtin",)


class _AliasLoader(importlib.abc.Loader):
    """Loads a name as an existing module (a simulator module, or an empty namespace)."""

    def __init__(
        self, module: types.ModuleType, children: dict[str, types.ModuleType] | None = None
    ) -> None:
        self.module = module
        self.own_spec = getattr(module, "__spec__", None)
        self.children = children or {}  # full name -> module, registered with this one

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is already executed; importlib has just set its ``__spec__`` to the
        alias's, so the module gets its own back (reloads and ``-m`` keep working)."""
        if self.own_spec is not None:
            module.__spec__ = self.own_spec
        for name, child in self.children.items():  # as importlib binds a loaded submodule
            sys.modules[name] = child
            setattr(module, name.rpartition(".")[2], child)


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
        children = {
            f"{fullname}.{child}": importlib.import_module(target)
            for child, target in _CHILDREN.get(fullname, {}).items()
        }
        self.provided += [fullname, *children]
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(module, children), is_package=hasattr(module, "__path__")
        )


def _simulator_module(fullname: str) -> types.ModuleType | None:
    """The simulator module behind ``fullname`` (None: no such module)."""
    if fullname in _NAMESPACES:  # a plain namespace holding ``nki``
        namespace = types.ModuleType(fullname, f"{fullname} on the asickernels simulator")
        namespace.__path__ = []
        return namespace
    for alias, target in ALIASES.items():
        if fullname == alias or fullname.startswith(alias + "."):
            name = target + fullname[len(alias) :]
            if importlib.util.find_spec(name) is not None:
                return importlib.import_module(name)
            if fullname in _UNUSED:
                return types.ModuleType(fullname, "not simulated: nki-library never uses it")
            return None
    return None


_finder: SimulatorFinder | None = None


def real_sdk_available(root: str) -> bool:
    """Whether a real ``root`` (a key of ``_REAL_API``) is installed and its API module
    imports."""
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
    """Hooks ``nki``, ``neuronxcc``, ``nki_cpu_simulator`` and ``neuron_dtypes`` where no real
    package imports; returns the hooked top-level names (empty when all are really
    installed). Idempotent."""
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
