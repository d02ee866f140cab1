"""What is still compiled at run time (GpSimd operators through the host shim, sanitizer
builds): where builds are cached, which compiler is used, and that an unwritable cache or a
broken compiler is a warning and a missing backend, never a crash, at import or in `info`."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import asickernels
from asickernels import _native_build
from asickernels.backends import gpsimd

# Where the asickernels under test lives (a checkout, or site-packages for an installed wheel).
PACKAGE_ROOT = Path(asickernels.__file__).resolve().parent.parent
GXX = shutil.which("g++")


@pytest.fixture
def fresh(monkeypatch):
    """No $CXX, no cache variables, and the per-process memos cleared."""
    for name in ("CXX", _native_build.CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    _native_build._problem.cache_clear()
    _native_build._temporary_cache.cache_clear()
    yield monkeypatch
    _native_build._problem.cache_clear()
    _native_build._temporary_cache.cache_clear()


def _fake_compiler(folder: Path, name: str, works: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if works and GXX is None:
        pytest.skip("needs g++ to stand in for a working compiler")
    body = f'exec {GXX} "$@"' if works else "echo broken >&2; exit 3"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_cache_dir_order(fresh, tmp_path):
    fresh.setenv("HOME", str(tmp_path / "home"))
    assert _native_build.cache_dir() == tmp_path / "home" / ".cache" / "asickernels"
    fresh.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _native_build.cache_dir() == tmp_path / "xdg" / "asickernels"
    fresh.setenv(_native_build.CACHE_ENV, str(tmp_path / "mine"))
    assert _native_build.cache_dir() == tmp_path / "mine"
    assert (tmp_path / "mine").is_dir()


@pytest.mark.parametrize("unwritable", ["/proc/asickernels", "/dev/null/asickernels"])
def test_an_unwritable_cache_is_one_warning_and_a_private_temporary_folder(fresh, unwritable):
    fresh.setenv(_native_build.CACHE_ENV, unwritable)
    with pytest.warns(_native_build.NativeBuildWarning, match="no writable build cache"):
        folder = _native_build.cache_dir()
    assert folder.is_dir() and os.access(folder, os.W_OK)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native_build.cache_dir() == folder


def test_compiler_search_order_and_a_broken_one_is_skipped_with_one_warning(fresh, tmp_path):
    bin_dir = tmp_path / "bin"
    fresh.setenv("PATH", str(bin_dir))
    assert _native_build.compiler() is None
    clang = _fake_compiler(bin_dir, "clang++", works=True)
    assert _native_build.compiler() == (str(clang),)
    cxx = _fake_compiler(bin_dir, "c++", works=True)
    assert _native_build.compiler() == (str(cxx),)
    _fake_compiler(bin_dir, "g++", works=False)
    with pytest.warns(_native_build.NativeBuildWarning, match="g\\+\\+ fails to compile.*broken"):
        assert _native_build.compiler() == (str(cxx),)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native_build.compiler() == (str(cxx),)  # the verdict is kept: no second warning
    fresh.setenv("CXX", "g++")  # an explicit choice is the only one tried
    assert _native_build.compiler() is None
    with pytest.raises(_native_build.NativeBuildError, match="no working C\\+\\+ compiler"):
        _native_build.require_compiler("a test")


def test_cxx_may_be_a_command_with_arguments(fresh, tmp_path):
    """``CXX="ccache g++"``: a launcher and its compiler, both used for every build."""
    bin_dir = tmp_path / "bin"
    _fake_compiler(bin_dir, "g++", works=True)
    launcher = bin_dir / "launcher"
    log = tmp_path / "launched.txt"
    launcher.write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec "$@"\n')
    launcher.chmod(0o755)
    fresh.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    fresh.setenv("CXX", "launcher g++ -DFROM_CXX=1")
    fresh.setenv(_native_build.CACHE_ENV, str(tmp_path / "cache"))
    assert _native_build.compiler() == (str(launcher), "g++", "-DFROM_CXX=1")
    source = tmp_path / "answer.cpp"
    source.write_text('extern "C" int answer() { return FROM_CXX + 41; }\n')
    library = _native_build.build("answer", [source], flags=["-std=c++17", "-fPIC", "-shared"])
    assert ctypes.CDLL(str(library)).answer() == 42
    assert "g++" in log.read_text().split()


@pytest.mark.parametrize(
    ("cxx", "problem"),
    [
        ("/nonexistent/c++", "names '/nonexistent/c\\+\\+', which is not an executable"),
        ("g++ 'unclosed", "does not parse as a command"),
        (" ", "is blank"),
        ("BROKEN", "fails to compile a C\\+\\+17 program \\(exit 3: broken\\)"),
    ],
)
def test_a_broken_cxx_is_named_with_what_failed(fresh, tmp_path, cxx, problem):
    """The error says what is wrong with the $CXX the user set, not to set $CXX."""
    if cxx == "BROKEN":
        cxx = str(_fake_compiler(tmp_path, "g++", works=False))
    fresh.setenv("CXX", cxx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _native_build.NativeBuildWarning)
        with pytest.raises(_native_build.NativeBuildError) as raised:
            _native_build.require_compiler("a test")
    message = str(raised.value)
    assert re.search(f"^no working C\\+\\+ compiler to build a test: \\$CXX=.*{problem}", message)
    assert (
        message.endswith("fix or unset $CXX")
        and "set $CXX" not in message[: -len("fix or unset $CXX")]
    )


def test_a_broken_compiler_leaves_gpsimd_missing_with_a_warning(fresh, tmp_path):
    fresh.setenv("CXX", str(_fake_compiler(tmp_path, "g++", works=False)))
    with pytest.warns(_native_build.NativeBuildWarning, match="fails to compile"):
        status = gpsimd.BACKEND.probe()
    assert status.mode == "missing" and "$CXX=" in status.detail and "broken" in status.detail


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(PACKAGE_ROOT),
            "JAX_PLATFORMS": "cpu",
            **env,
        },
        cwd="/",
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("home", ["/", "/proc"])
def test_import_and_info_with_an_unwritable_home(home):
    """`import asickernels` and `asickernels info` build nothing and write nothing at
    import; an unwritable home (``docker run --user``: HOME=/) is no error."""
    result = _run(
        "import asickernels, sys; from asickernels import cli; sys.exit(cli.main(['info']))",
        {"HOME": home},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "cpu" in result.stdout and "Traceback" not in result.stderr


def test_a_broken_compiler_in_info_is_the_truth_and_one_warning(tmp_path):
    broken = _fake_compiler(tmp_path, "g++", works=False)
    result = _run(
        "import sys; from asickernels import cli; sys.exit(cli.main(['info']))",
        {"HOME": str(tmp_path), "CXX": str(broken)},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    gpsimd_line = next(line for line in result.stdout.splitlines() if line.startswith("gpsimd"))
    assert "missing" in gpsimd_line and "compiler" in gpsimd_line
    assert result.stderr.count("fails to compile") == 1, result.stderr
