"""The README and the guides in docs/ say what the code does: every ```python block runs (in a
fresh interpreter, in a folder holding the page's named blocks — ```cpp blocks, and ```python
blocks whose first line is ``# name.py`` — under those names) and prints what its
``# prints ...`` comments say; the kernel x backend table is the
registry's; every relative link leads to a file.

The guides' blocks are in the slow tier. A block is skipped, not failed, only where this
interpreter lacks what it needs: a module it imports (torch, torch_xla), libtpu for a TPU
compile, a C++ compiler for the GpSimd shim.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import REPO as ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# `print(...)  # prints TEXT; a remark`: TEXT must be in what the block printed.
PRINTS = re.compile(r"# prints ([^;\n]+)")
README_MAX_LINES = 200
EXAMPLE_TIMEOUT_S = 900  # a hung example fails instead of hanging the suite


def blocks(page: pathlib.Path, language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text()) if lang == language]


# A block's first line naming the file it is: ``// kernel.cpp`` or ``# someone_elses.py``.
FILE_NAME = re.compile(r"(?://|#) ([\w.]+\.(?:cpp|h|hpp|py))")


def named_blocks(page: pathlib.Path) -> dict[str, str]:
    """The page's blocks that name their file (every ```cpp block, some ```python ones)."""
    named = {}
    for source in blocks(page, "cpp") + blocks(page, "python"):
        name = FILE_NAME.fullmatch(source.splitlines()[0])
        if name:
            named[name.group(1)] = source
    return named


def _missing_requirement(code: str, local: set[str]) -> str | None:
    """What this interpreter lacks to run ``code`` (beside the modules ``local`` names), or
    None."""
    for node in ast.walk(ast.parse(code)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            known = top in ("nki", "neuronxcc") or top in local
            if not known and importlib.util.find_spec(top) is None:
                return f"{top} is not installed"
    needs_libtpu = "tpu_compile" in code or "tpu_estimate" in code
    if needs_libtpu and importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed"
    if "gpsimd.load" in code:
        from asickernels.simulate import gpsimd

        if gpsimd.compiler() is None:
            return "no C++ compiler"
    return None


# The README's blocks run in the fast tier; the guides' (torch.compile, SPMD) in the slow one.
EXAMPLES = [
    pytest.param(
        page,
        index,
        code,
        id=f"{page.relative_to(ROOT)}-{index}",
        marks=() if page.name == "README.md" else pytest.mark.slow,
    )
    for page in PAGES
    for index, code in enumerate(blocks(page, "python"))
]


@pytest.mark.parametrize(("page", "index", "code"), EXAMPLES)
def test_example_runs(page, index, code, tmp_path):
    named = named_blocks(page)
    missing = _missing_requirement(code, {name.removesuffix(".py") for name in named})
    if missing:
        pytest.skip(missing)
    for name, source in named.items():
        (tmp_path / name).write_text(source)
    # This checkout's asickernels first, whatever the interpreter has installed.
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.setdefault("PJRT_DEVICE", "CPU")
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{page.name} block {index} failed:\n{done.stderr[-3000:]}"
    for expected in PRINTS.findall(code):
        assert expected.strip() in done.stdout, f"{page.name} block {index}: no {expected!r}"


def test_every_page_has_examples_and_cpp_blocks_are_named():
    assert blocks(ROOT / "README.md", "python")
    for page in PAGES:
        for source in blocks(page, "cpp"):
            assert re.fullmatch(r"// [\w.]+\.(cpp|h|hpp)", source.splitlines()[0]), page


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_the_kernel_table_is_the_registrys():
    spec = importlib.util.spec_from_file_location("op_table", ROOT / "docs" / "op_table.py")
    assert spec is not None and spec.loader is not None
    op_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(op_table)
    assert op_table.readme_table((ROOT / "README.md").read_text()) == op_table.table(), (
        "README.md's kernel table differs from the registry: run `python docs/op_table.py --write`"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_files(page):
    import asickernels

    # Links into the package resolve in the checkout, or where the package is installed
    # (an sdist's tests run against an installed wheel, with no sources beside them).
    installed = pathlib.Path(asickernels.__file__).resolve().parent.parent
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        if not path.exists() and path.is_relative_to(ROOT / "asickernels"):
            path = installed / path.relative_to(ROOT)
        assert path.exists(), f"{page.name} links to missing {target}"
