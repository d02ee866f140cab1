"""Pallas comes from its public home, ``jax.pallas``, where the installed jax has it, and one
module (asickernels/pallas_home.py) decides where it comes from."""

from __future__ import annotations

import importlib.util
import re

from conftest import REPO

from asickernels.pallas_home import pl, pltpu

# `from jax.experimental import pallas as pl`, `from jax.experimental.pallas import tpu`, ...;
# not the kernels jax ships under jax.experimental.pallas.ops (megablox, splash), only there.
EXPERIMENTAL = re.compile(
    r"^\s*(from jax\.experimental import pallas\b"
    r"|from jax\.experimental\.pallas\b(?!\.ops\b).* import"
    r"|import jax\.experimental\.pallas\b(?!\.ops\b))",
    re.M,
)


def test_pallas_comes_from_jax_pallas_where_this_jax_has_it():
    public = importlib.util.find_spec("jax.pallas") is not None
    assert pl.__name__ == ("jax.pallas" if public else "jax.experimental.pallas")
    assert pltpu.__name__ == pl.__name__ + ".tpu"
    assert callable(pl.pallas_call) and callable(pltpu.InterpretParams)


def test_no_other_module_imports_pallas_from_jax_experimental():
    for line in (
        "from jax.experimental import pallas as pl",
        "    from jax.experimental.pallas import tpu as pltpu",
        "import jax.experimental.pallas.tpu",
    ):
        assert EXPERIMENTAL.search(line), line
    assert not EXPERIMENTAL.search("from jax.experimental.pallas.ops.tpu import megablox")
    chooser = REPO / "asickernels" / "pallas_home.py"
    for path in sorted([*(REPO / "asickernels").rglob("*.py"), *(REPO / "tests").rglob("*.py")]):
        if path == chooser or "data" in path.relative_to(REPO).parts:  # vendor code
            continue
        found = EXPERIMENTAL.findall(path.read_text())
        assert not found, f"{path.relative_to(REPO)} imports Pallas itself: use {chooser.name}"
