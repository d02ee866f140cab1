"""The opt-in import hook (asickernels.simulate.nki.install) and the module runner
``python -m asickernels.simulate.nki script.py``."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from asickernels.simulate import nki as simulator
from asickernels.simulate.nki import install as hook
from asickernels.simulate.nki import legacy

HOOKED = ("nki", "neuronxcc", "nki_cpu_simulator", "neuron_dtypes")


def _forget(*roots: str) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in roots]:
        del sys.modules[name]


@pytest.fixture
def clean_imports() -> Iterator[None]:
    """No hook and no ``nki``/``neuronxcc`` modules before and after the test."""
    hook.uninstall()
    _forget(*HOOKED)
    importlib.invalidate_caches()
    yield
    hook.uninstall()
    _forget(*HOOKED)
    importlib.invalidate_caches()


def test_hook_resolves_both_generations(clean_imports):
    if any(hook.real_sdk_available(root) for root in HOOKED):
        pytest.skip("a real Neuron SDK is installed here")
    assert hook.install() == HOOKED
    assert hook.install() == HOOKED  # idempotent
    import neuronxcc.nki as legacy_nki
    import neuronxcc.nki.isa as legacy_isa
    import neuronxcc.nki.language as legacy_nl
    import nki
    import nki.language
    from neuronxcc import nki as from_import

    assert legacy_nki is legacy and from_import is legacy
    assert legacy_nl is legacy.language and legacy_isa is legacy.isa
    assert nki is simulator and nki.language is simulator.language
    assert simulator.__spec__.name == "asickernels.simulate.nki"  # the alias leaves it alone
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("neuronxcc.nki.no_such_module")
    # the module names AWS's kernels and tests import (issue 24)
    from neuronxcc.nki import benchmark, profile  # noqa: F401
    from neuronxcc.nki.isa.constants import dge_mode
    from nki.dtype import float8_e4m3fn_x4
    from nki.isa.constants import engine

    assert dge_mode is legacy.isa.dge_mode and engine is simulator.isa.engine
    assert float8_e4m3fn_x4 is simulator.language.float8_e4m3fn_x4


def test_uninstall_restores_imports(clean_imports):
    if any(hook.real_sdk_available(root) for root in HOOKED):
        pytest.skip("a real Neuron SDK is installed here")
    hook.install()
    importlib.import_module("neuronxcc.nki.language")
    hook.uninstall()
    assert hook.installed() == ()
    assert not any(isinstance(f, hook.SimulatorFinder) for f in sys.meta_path)
    assert not [n for n in sys.modules if n.split(".")[0] in HOOKED]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("neuronxcc.nki")


def _fake_package(root: Path, name: str, body: str) -> None:
    package = root.joinpath(*name.split("."))
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)


@pytest.mark.parametrize(
    ("nki_body", "hooked"),
    [("REAL = True\n", ()), ("raise ImportError('placeholder package')\n", ("nki",))],
    ids=["real", "broken"],
)
def test_hook_never_shadows_a_real_sdk(clean_imports, tmp_path, monkeypatch, nki_body, hooked):
    """A (fake) real ``neuronxcc.nki``, ``nki``, ``nki_cpu_simulator.nki`` and
    ``neuron_dtypes`` on sys.path win: nothing is hooked. A real ``nki`` that fails to import
    counts as absent (hooked); the working others stay."""
    _fake_package(tmp_path, "nki", nki_body)
    _fake_package(tmp_path, "nki.language", "")
    for namespace in ("neuronxcc", "nki_cpu_simulator"):
        _fake_package(tmp_path, namespace, "")
        _fake_package(tmp_path, f"{namespace}.nki", "REAL = True\n")
    _fake_package(tmp_path, "neuron_dtypes", "REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert hook.install() == hooked
    for real in ("neuronxcc.nki", "nki_cpu_simulator.nki", "neuron_dtypes"):
        assert importlib.import_module(real).REAL
    if hooked:
        assert importlib.import_module("nki") is simulator
    else:
        assert importlib.import_module("nki").REAL


def test_a_folder_named_nki_on_sys_path_is_not_an_sdk(clean_imports, tmp_path, monkeypatch):
    """pytest puts test folders on sys.path, and tests/simulate holds a folder ``nki``: it
    imports as a namespace package, which must not count as a real ``nki``."""
    (tmp_path / "nki").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert importlib.util.find_spec("nki") is not None
    assert not hook.real_sdk_available("nki")


SCRIPT = """
import sys
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def add_one(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:x.shape[0], 0:x.shape[1]]
    nl.store(out[i_p, i_f], nl.load(x[i_p, i_f]) + 1.0)
    return out


x = np.arange(8, dtype=np.float32).reshape(2, 4)
assert np.array_equal(add_one(x), x + 1)
print("ran", __name__, sys.argv[1:])
"""


def test_module_runner_runs_a_script_unchanged(tmp_path):
    if any(hook.real_sdk_available(root) for root in HOOKED):
        pytest.skip("a real Neuron SDK is installed here")
    script = tmp_path / "user_kernel.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run(
        [sys.executable, "-m", "asickernels.simulate.nki", str(script), "--flag", "7"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ran __main__ ['--flag', '7']" in result.stdout


def test_module_runner_without_a_script_prints_usage():
    result = subprocess.run(
        [sys.executable, "-m", "asickernels.simulate.nki"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "script.py" in result.stdout
