"""The simulators are the floor the kernels stand on, and floors run one way: no module under
asickernels/simulate imports the op layer (asickernels.kernels, or the public ops through
``import asickernels``) or the backends (asickernels.backends), at module level or inside a
function. What applies the simulators to our own kernels lives above both, in
asickernels/estimates."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# The package being tested: the checkout's, or the installed wheel's (the package tier runs
# these tests from the sdist, whose tree has no asickernels folder).
_spec = importlib.util.find_spec("asickernels")
assert _spec is not None and _spec.origin is not None
PACKAGE = Path(_spec.origin).resolve().parent
UPPER = ("asickernels.kernels", "asickernels.backends")


def _is_module(name: str) -> bool:
    """Whether ``name`` (``asickernels.x.y``) is a module or package of this tree."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def upward_imports(source: str, module: str) -> list[str]:
    """What ``source`` (the module named ``module``) imports from above the simulators, as
    ``line: name``: every ``import``/``from ... import`` anywhere in it (relative ones
    resolved), and ``importlib.import_module``/``__import__`` of a literal name."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            # `from asickernels import giou` takes a public op; `import tpu_generations` a module.
            targets = [
                f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]
        found += [
            f"{node.lineno}: {name}"
            for name in targets
            if name == "asickernels" or any(name == up or name.startswith(f"{up}.") for up in UPPER)
        ]
    return found


def test_the_check_sees_every_way_to_import_upward():
    module = "asickernels.simulate.tpu_estimate.example"
    upward = {
        "import asickernels": "asickernels",
        "from asickernels.kernels.nms import greedy_nms": "asickernels.kernels.nms",
        "from asickernels import kernels": "asickernels.kernels",
        "from asickernels import giou": "asickernels",
        "def f():\n    from asickernels.backends.pallas_tpu import lowering": (
            "asickernels.backends.pallas_tpu.lowering"
        ),
        "from ...backends import nki": "asickernels.backends.nki",
        "importlib.import_module('asickernels.kernels.case_tables')": (
            "asickernels.kernels.case_tables"
        ),
    }
    for source, name in upward.items():
        assert [line.split(": ")[1] for line in upward_imports(source, module)] == [name], source
    for source in (
        "from asickernels import tpu_generations",
        "from asickernels.simulate.tpu_compile import Built",
        "from .. import tpu_compile",
        "from asickernels.pallas_home import pl",
        "import jax.numpy as jnp",
    ):
        assert upward_imports(source, module) == [], source


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "simulate").rglob("*.py")),
    ids=lambda path: str(path.relative_to(PACKAGE)),
)
def test_no_simulator_imports_the_kernels_or_the_backends(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if parts[-1] == "__init__":
        module += ".__init__"  # relative imports resolve against the package itself
    found = upward_imports(path.read_text(), module)
    assert not found, (
        f"{path.relative_to(PACKAGE.parent)} imports above the simulators ({'; '.join(found)}): move what "
        "is about our kernels to asickernels/estimates, or pass it in"
    )
