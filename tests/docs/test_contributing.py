"""docs/contributing.md's "Adding an op" is the path the code has: every file it names exists
(``<op>`` read as an op that has been added that way, NMS), every table it names is where it
says, every op's cases module is gathered, and the frontends it says are generated are. In
the slow tier, its steps are followed as written in a copy of the repository: its example op
added, built and run."""

from __future__ import annotations

import importlib
import os
import pathlib
import pkgutil
import re
import shutil
import site
import subprocess
import sys

import pytest
from conftest import REPO as ROOT

import asickernels
from asickernels import kernels
from asickernels.frontends import generate
from asickernels.kernels import case_tables

GUIDE = ROOT / "docs" / "contributing.md"
# Where the package's files are: the checkout, or beside an installed wheel (.ci/package runs
# the sdist's tests with the sources removed) where the package is installed.
PACKAGE_ROOT = pathlib.Path(asickernels.__file__).resolve().parent.parent
EXAMPLE = {"<op>": "nms", "<backend>": "xla"}


def _section() -> str:
    text = GUIDE.read_text()
    start = text.index("## Adding an op")
    return text[start : text.index("\n## ", start + 1)]


def _named_files() -> list[str]:
    found = set()
    for path in re.findall(r"`([\w<>./]+\.py)`", _section()):
        for placeholder, example in EXAMPLE.items():
            path = path.replace(placeholder, example)
        found.add(
            path if path.startswith(("asickernels/", "tests/", "docs/")) else f"asickernels/{path}"
        )
    return sorted(found)


def test_the_section_names_the_files_of_each_step():
    assert len(_named_files()) >= 12


@pytest.mark.parametrize("path", _named_files())
def test_each_file_it_names_exists(path):
    root = PACKAGE_ROOT if path.startswith("asickernels/") else ROOT
    assert (root / path).is_file(), f"docs/contributing.md names {path}, which is not there"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("asickernels.kernels.public", "OPS"),
        ("asickernels.kernels.cases", "Workload"),
        ("asickernels.kernels.cases", "Work"),
    ],
)
def test_each_table_it_names_is_there(module, name):
    assert name in _section()
    assert hasattr(importlib.import_module(module), name)


def test_every_cases_module_is_gathered_and_complete():
    modules = {
        f"{kernels.__name__}.{info.name}"
        for info in pkgutil.iter_modules(kernels.__path__)
        if info.name.endswith("_cases")
    }
    assert modules == {module.__name__ for module in case_tables.CASE_MODULES}
    for module in case_tables.CASE_MODULES:
        for table in ("WORKLOADS", "COMPILE_SHAPES", "NKI_ESTIMATES"):
            assert isinstance(getattr(module, table), tuple), f"{module.__name__}.{table}"
        assert callable(module.examples), f"{module.__name__}.examples"


def test_every_public_op_is_exported_and_has_examples():
    assert {op.name for op in asickernels.OPS} <= set(asickernels.__all__)
    assert all(getattr(asickernels, op.name) is op for op in asickernels.OPS)
    assert set(case_tables.examples()) == {op.name for op in asickernels.OPS}


def test_every_workload_compile_shape_and_estimate_names_a_public_op():
    public = {op.name for op in asickernels.OPS}
    assert set(case_tables.WORKLOADS) <= public
    assert {shape.op for shape in case_tables.COMPILE_SHAPES} <= public
    assert {row.op for row in case_tables.NKI_ESTIMATES} <= set(case_tables.WORKLOADS)


def test_the_test_tables_take_the_examples_from_the_cases():
    assert "examples" in _section()
    for path in ("tests/frontends/frontend_cases.py", "tests/kernels/test_validation.py"):
        assert "case_tables.examples(" in (ROOT / path).read_text(), path


def test_the_generate_step_leaves_the_frontends_as_checked_in():
    assert "python -m asickernels.frontends.generate" in _section()
    assert generate.main(["--check"]) == 0


# -- the steps, followed ---------------------------------------------------------------------

# The section's code blocks of the example op: the file each names in its info string, and
# the commands of its ```bash example block.
FILE_BLOCK = re.compile(r"^```\w+ (asickernels/[\w/.]+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
COMMANDS = re.compile(r"^```bash example\n(.*?)^```$", re.MULTILINE | re.DOTALL)
STEP_TIMEOUT_S = 900  # the build compiles the whole cpu library: about 2 minutes here
# The example op through the public API on its CPU kernel, on numpy and JAX arrays, float32
# and float64, and under jit, against its reference.
CALLS = """
import functools

import jax
import numpy as np

import asickernels
from asickernels.kernels import oracle

op = asickernels.box_area
boxes = np.array([[0, 0, 2, 3], [1, 1, 1, 5], [-1.5, 2, 0.5, 2.25]], np.float32)
for given in (boxes, jax.numpy.asarray(boxes), boxes.astype(np.float64)):
    got = op(given, backend="cpu")
    assert got.dtype == given.dtype, got.dtype
    oracle.assert_agrees(op, got, op.reference(given))
oracle.assert_agrees(op, jax.jit(functools.partial(op, backend="cpu"))(boxes), op.reference(boxes))
"""


def _example_files() -> dict[str, str]:
    return dict(FILE_BLOCK.findall(_section()))


def test_the_example_is_the_number_of_files_and_folders_it_says():
    files = _example_files()
    folders = {path.rsplit("/", 1)[0] for path in files}
    assert f"is {len(files)} files in {len(folders)} folders" in " ".join(_section().split())
    assert not any((ROOT / path).exists() for path in files), "the example op exists already"


def _copy_of_the_repository(to: pathlib.Path) -> None:
    """The repository's tracked files, as they are in the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.exists() or source.is_symlink():  # a file deleted but not yet staged is not
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name, follow_symlinks=False)


def _fresh_environment(venv: pathlib.Path) -> dict[str, str]:
    """A new venv of this interpreter that sees this environment's packages (the Makefile's
    .venv when ``make test`` runs this) but installs into its own: what the guide's pip
    command installs goes there, not here. Returns the variables to run commands in it, as
    ``source venv/bin/activate`` sets them."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = {pathlib.Path(p) for p in venv.glob("lib/python*/site-packages")}
    # A plain path entry: this environment's packages, but not its .pth hooks (its own
    # editable asickernels).
    (purelib / "this_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return dict(
        os.environ,
        VIRTUAL_ENV=str(venv),
        PATH=os.pathsep.join([str(venv / "bin"), os.environ["PATH"]]),
        PJRT_DEVICE="CPU",
    )


@pytest.mark.slow
def test_the_steps_add_build_and_run_the_example_op(tmp_path):
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the repository's files are not listed")
    clone = tmp_path / "clone"
    _copy_of_the_repository(clone)
    env = _fresh_environment(tmp_path / "venv")
    for path, source in _example_files().items():
        (clone / path).write_text(source)
    (commands,) = COMMANDS.findall(_section())
    for command in filter(None, (line.split(" #")[0].strip() for line in commands.splitlines())):
        done = subprocess.run(
            command,
            shell=True,
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"`{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    library = clone / "asickernels" / "backends" / "cpu"
    assert list(library.glob("_kernels*.so")), "the build left no cpu library in place"
    done = subprocess.run(
        ["python", "-c", CALLS], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
