"""Walks the NKI API reference list (asickernels/simulate/nki/reference.json): every name of
the current ``nki`` namespace resolves in the simulator; a name a later release deprecated or
removed runs with a DeprecatedApiWarning naming that release; a name the simulator refuses
raises NotImplementedError naming it; every function, class and method the simulator
implements is exercised by a test (or by vendor code a corpus test runs unchanged)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import warnings
from pathlib import Path

import pytest

from asickernels.simulate import nki
from asickernels.simulate.nki import errors, reference
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl

ENTRIES = reference.entries()
TESTS = Path(__file__).resolve().parent
# The vendor code the corpus tests run unchanged (absent where ../shared is absent).
VENDOR = [
    TESTS.parents[2] / ".." / "shared" / "corpus" / "nki" / "aws-neuron-sdk@81ce03a",
    TESTS.parents[2] / ".." / "shared" / "vendor" / "aws-neuron-sdk@81ce03a",
]


def resolve(name: str):
    """The simulator's object for the dotted reference ``name`` (``nki.`` replaced by the
    simulator package), or AttributeError / ImportError; for a parameter, the function
    that takes it."""
    if ENTRIES[name].kind == "parameter":
        function_name, parameter = name.rsplit(".", 1)
        function = resolve(function_name)
        if parameter not in inspect.signature(function).parameters:
            raise AttributeError(f"{function_name} takes no {parameter}")
        return function
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module_name = "asickernels.simulate." + ".".join(parts[:split])
        try:
            found = importlib.import_module(module_name)
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(name)


def owned_elsewhere(entry: reference.Entry) -> bool:
    return entry.owner != "nki-api"


# Modules another engineer creates; names of ours listed in them resolve once theirs exists
# (nki.compiler re-exports compile_config's classes).
MODULE_OWNERS = {"nki.compiler": "neuron-alloc"}


def _module_missing(name: str) -> str | None:
    for module, owner in MODULE_OWNERS.items():
        if (
            name.startswith(module + ".")
            and importlib.util.find_spec("asickernels.simulate." + module) is None
        ):
            return f"{module} is {owner}'s module, not in this checkout yet"
    return None


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_name_resolves(name):
    entry = ENTRIES[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.DeprecatedApiWarning)
            if entry.unsupported:  # refused when used: resolving it may already refuse
                with pytest.raises(NotImplementedError, match=re.escape(name)):
                    run_in_kernel(lambda: _use(name))
                return
            resolve(name)
    except (ImportError, AttributeError):
        if owned_elsewhere(entry):
            pytest.xfail(f"{name} is {entry.owner}'s, not in this checkout yet")
        if _module_missing(name):
            pytest.xfail(_module_missing(name))
        raise


def test_the_list_is_consistent():
    versions = reference.releases()
    assert sorted(ENTRIES) == [e["name"] for e in _raw_entries()]  # sorted, no duplicates
    for entry in ENTRIES.values():
        assert entry.source, entry.name
        for version in (entry.added, entry.deprecated, entry.removed):
            assert version is None or version in versions, entry
        if entry.deprecated and entry.removed:
            assert float(entry.deprecated) <= float(entry.removed), entry
        assert entry.kind in {"function", "class", "method", "attribute", "property",
                              "constant", "protocol", "parameter"}, entry  # fmt: skip


def _raw_entries():
    import json

    return json.loads(reference.REFERENCE_FILE.read_text())["entries"]


def run_in_kernel(use):
    """Runs ``use()`` inside a kernel (NKI APIs exist only there)."""

    @nki.jit
    def kernel():
        use()

    kernel()


# How to use each deprecated or removed name (the call may then fail on its arguments: the
# warning comes first).
def _dma_copy_with(**removed):
    hbm = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=hbm, src=nl.zeros((2, 2), nl.float32), **removed)


USES = {
    "nki.isa.dma_copy.dst_rmw_op": lambda: _dma_copy_with(dst_rmw_op=nl.add),
    "nki.isa.dma_copy.unique_indices": lambda: _dma_copy_with(unique_indices=True),
    "nki.isa.VirtualRegister.__bool__": lambda: bool(nisa.VirtualRegister.holding(1)),
    "nki.isa.VirtualRegister.__index__": lambda: int(nisa.VirtualRegister.holding(1)),
    "nki.isa.NkiScalar.__index__": lambda: range(nisa.NkiScalar(3)),
}


def _use(name):
    if name in USES:
        return USES[name]()
    found = resolve(name)  # constants and attributes warn when read
    if callable(found) and ENTRIES[name].kind in ("function", "class"):
        args, kwargs = _placeholders(found)
        found(*args, **kwargs)


def _placeholders(function):
    """None for each required parameter, as (args, kwargs): a refused or changed API says so
    before it looks at its arguments."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return [], {}
    required = [p for p in parameters if p.default is p.empty]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    args = [None for p in required if p.kind in positional]
    kwargs = {p.name: None for p in required if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return args, kwargs


@pytest.mark.parametrize("name", sorted(n for n, e in ENTRIES.items() if e.deprecated or e.removed))
def test_names_a_later_release_changed_warn_naming_the_release(name):
    entry = ENTRIES[name]
    if owned_elsewhere(entry):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            pytest.xfail(f"{name} is {entry.owner}'s, not in this checkout yet")
    release = f"NKI {entry.removed or entry.deprecated}"
    # called without arguments, a function may then fail: the warning was issued before
    with (
        pytest.warns(errors.DeprecatedApiWarning, match=re.escape(name)) as caught,
        contextlib.suppress(TypeError, errors.NkiValidationError, ValueError),
    ):
        run_in_kernel(lambda: _use(name))
    assert any(release in str(w.message) for w in caught), [str(w.message) for w in caught]


def _test_sources() -> str:
    texts = [p.read_text() for p in TESTS.glob("*.py") if p.name != Path(__file__).name]
    for root in VENDOR:
        if root.is_dir():
            texts += [p.read_text() for p in root.rglob("*.py")]
    return "\n".join(texts)


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n, e in ENTRIES.items()
        if e.kind in ("function", "class", "method")
        and not e.unsupported
        and not e.removed
        and not owned_elsewhere(e)
    ),
)
def test_every_simulated_function_is_exercised_by_a_test(name):
    leaf = name.rsplit(".", 1)[-1]
    if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(leaf)}(?![A-Za-z0-9_])", _sources()):
        pytest.fail(f"no test uses {name}")


_cache: dict[str, str] = {}


def _sources() -> str:
    if "text" not in _cache:
        _cache["text"] = _test_sources()
    return _cache["text"]


def test_counts():
    """The size of the reference the simulator covers (reported, and a guard against the
    list shrinking by accident)."""
    assert len(ENTRIES) >= 386
    assert sum(1 for e in ENTRIES.values() if e.unsupported) <= 4
    assert nl.NkiTileGrid is resolve("nki.language.NkiTileGrid")
