"""The install path the README leads with is the release wheel (`make dist`, one script that
CI's package check also builds with), and the install guide covers every extra."""

from __future__ import annotations

import re
import tomllib

import pytest
from conftest import REPO as ROOT

FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _install_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Install") : readme.index("\n## ", readme.index("## Install"))]


def test_the_readme_installs_the_wheel_and_cpu_torch():
    (commands,) = [code for lang, code in FENCE.findall(_install_section()) if lang == "bash"]
    lines = [line.split(" #")[0].strip() for line in commands.splitlines()]
    assert lines[0] == "make dist"
    for line in lines[1:]:
        assert line.startswith("pip install") and "-e" not in line.split()
        assert (
            "--find-links dist" in line
            or "--index-url https://download.pytorch.org/whl/cpu" in line
        )
    torch_cpu = next(i for i, line in enumerate(lines) if "whl/cpu" in line)
    torch_extra = next(i for i, line in enumerate(lines) if "[torch]" in line)
    assert torch_cpu < torch_extra  # the CPU build first, or [torch] pulls CUDA's


def test_the_install_guide_lists_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    guide = (ROOT / "docs" / "install.md").read_text()
    listed = set()
    for row in re.findall(r"^\| (.+?) \|", guide, re.MULTILINE):
        listed.update(re.findall(r"`([\w-]+)`", row))
    assert listed == set(extras)


@pytest.mark.skipif(not (ROOT / ".ci").is_dir(), reason="an sdist has no .ci/")
def test_one_script_builds_the_release_for_make_dist_and_ci():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^dist:\n\t.*\.ci/dist dist$", makefile, re.MULTILINE)
    package = "\n".join(  # its commands, without the comments
        line
        for line in (ROOT / ".ci" / "package").read_text().splitlines()
        if not line.lstrip().startswith("#")
    )
    assert ".ci/dist" in package
    for step in ("auditwheel", "-m build", "ziglang"):  # .ci/dist's, not repeated
        assert step not in package, step
        assert step in (ROOT / ".ci" / "dist").read_text(), step
