"""docs/contributing.md's "Adding an op" is the path the code has: every file it names exists
(``<op>`` read as an op that has been added that way, NMS), every table it names is where it
says, every op's cases module is gathered, and the frontends it says are generated are."""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
import re

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
        ("asickernels.estimates.nki_estimates", "_WORK"),
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
