"""The commands the README and the guides tell a user to type exist as written: every
``asickernels ...`` line of their shell blocks parses (command and flags), every command they
name inline exists and has the flags they give it, every ``--help`` prints without an error,
every ``pip install`` extra is one pyproject.toml declares, every ``python`` script or module
and ``make`` target they name is there. Nothing here runs a kernel: it is all argument parsing.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import tomllib

import pytest
from conftest import REPO as ROOT

import asickernels
from asickernels import cli

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fenced block: its language, the rest of its info string, its code. Blocks whose info string
# says more than the language (docs/contributing.md's example op, which does not exist here:
# its files and commands) are run by tests/docs/test_contributing.py, not checked here.
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
COMMANDS = ("info", "check", "bench", "run", *cli.PLUGINS)


def _shell_lines(page) -> list[str]:
    """The commands of a page's ```bash blocks, continuation lines joined, comments cut."""
    lines = []
    for language, info, code in FENCE.findall(page.read_text()):
        if language not in ("bash", "sh", "shell") or info:
            continue
        for line in code.replace("\\\n", " ").splitlines():
            command = line.split(" #")[0].strip()
            if command:
                lines.append(command)
    return lines


def _inline_spans(page) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def _documented(prefix: str) -> list[tuple[str, str]]:
    """(page, command) for every shell line and inline span that starts with ``prefix``."""
    found = []
    for page in PAGES:
        for command in [*_shell_lines(page), *_inline_spans(page)]:
            if command.startswith(prefix):
                found.append((str(page.relative_to(ROOT)), command))
    return found


def _help(capsys, command: str) -> str:
    assert cli.main([command, "--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "", f"`asickernels {command} --help` wrote to stderr:\n{err}"
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_its_help(capsys, command):
    assert f"usage: asickernels {command}" in _help(capsys, command)


def _shell_commands() -> list[tuple[str, str]]:
    return [
        (page, command)
        for page in PAGES
        for command in _shell_lines(page)
        if command.startswith("asickernels ")
    ]


@pytest.mark.parametrize(("page", "command"), _shell_commands(), ids=lambda value: str(value))
def test_every_shell_block_command_parses(page, command):
    argv = shlex.split(command)[1:]
    parser = cli.build_parser(argv[0] if argv[0] in cli.PLUGINS else None)
    try:
        parser.parse_args(argv)
    except SystemExit as stop:
        pytest.fail(f"{page}: `{command}` does not parse (exit {stop.code})")


def test_every_command_named_inline_exists_with_its_flags(capsys):
    helps: dict[str, str] = {}
    for page, span in _documented("asickernels "):
        words = shlex.split(span)[1:]
        if words[0].startswith("-"):
            continue  # `asickernels --help`, tested above with every command
        command = words[0]
        assert command in COMMANDS, f"{page}: `{span}` names no asickernels command"
        if command not in helps:
            helps[command] = _help(capsys, command)
        for flag in (word for word in words[1:] if word.startswith("--")):
            assert flag in helps[command], f"{page}: `{span}`: {command} has no {flag}"


def test_every_pip_extra_named_exists():
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    named = set()
    for page in [*PAGES, ROOT / "Makefile"]:
        for group in re.findall(r"(?:asickernels|\.)\[([\w,-]+)\]", page.read_text()):
            named.update(group.split(","))
    assert named, "no page names an extra"
    assert named <= extras, f"extras the docs name that pyproject.toml lacks: {named - extras}"


def test_every_python_script_and_module_named_exists():
    named = _documented("python ")
    assert named
    for page, command in named:
        words = shlex.split(command)
        if words[1] == "-m":
            assert importlib.util.find_spec(words[2]) is not None, f"{page}: no module {words[2]}"
        elif words[1].endswith(".py") and "/" in words[1]:  # a repository script
            assert (ROOT / words[1]).is_file(), f"{page}: no script {words[1]}"


def test_every_make_target_named_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for page, command in _documented("make "):
        target = command.split()[1]
        assert target in targets, f"{page}: `{command}`: the Makefile has no {target}"


# -- what the guides say exists --------------------------------------------------------------

# The short names the pages use, as their examples import them.
ALIASES = {"ak": "asickernels", "akt": "asickernels.torch"}
# Modules of ours that import a package not every environment has: the package.
NEEDS = {"torch": "torch", "torch_xla_spmd": "torch_xla", "torch_tpu": "torch_tpu"}
# Named by the pages but absent from a clone by design: a folder of ../shared/corpus, where
# tests/fetch_vendor.py puts the vendor code it fetches, and where `make dist` writes the
# wheel (both gitignored).
ABSENT_BY_DESIGN = ("neuron-customops/", "tests/data/vendor/", "dist/")


# Where the package's sources are not beside the tests (.ci/package tests the installed wheel
# from the sdist with its sources removed), its paths are looked up in the installed package,
# which ships no C++ sources.
SOURCES_HERE = (ROOT / "asickernels").is_dir()


def _repository_files() -> list[str]:
    """The checkout's files and folders, relative to it (plus the installed package's)."""
    package = pathlib.Path(asickernels.__file__).resolve().parent
    files = [package.name]  # the package's folder itself, also beside an installed wheel
    for root, top in ((ROOT, ROOT), (package.parent, package)):
        for folder, subfolders, names in os.walk(top):
            subfolders[:] = [name for name in subfolders if not name.startswith((".", "__"))]
            relative = pathlib.Path(folder).relative_to(root)
            files += [(relative / name).as_posix() for name in [*subfolders, *names]]
    return files


def _resolves(name: str) -> bool:
    """Whether ``name`` (``package.module.attribute...``) imports and has its attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise  # a module it imports is missing: not what this test looks for
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_python_name_the_pages_give_exists():
    checked = 0
    for page in PAGES:
        for span in _inline_spans(page):
            match = re.match(r"^(asickernels|ak|akt)((?:\.\w+)+)", span)
            if not match:
                continue
            name = ALIASES.get(match[1], match[1]) + match[2]
            needs = {NEEDS[part] for part in name.split(".")[1:] if part in NEEDS}
            if any(importlib.util.find_spec(package) is None for package in needs):
                continue  # the environment that has those packages checks these names
            assert _resolves(name), f"{page.name}: `{span}` names nothing ({name})"
            checked += 1
    assert checked > 10


def test_every_repository_path_the_pages_give_exists():
    files = _repository_files()
    for page in PAGES:
        for span in _inline_spans(page):
            for word in re.findall(r"[\w./-]+", span):
                if "/" not in word or word.startswith(("../", "/")) or "://" in span:
                    continue
                if not re.search(r"\.(py|json|md|h|cpp|txt|png|toml)$|/$", word):
                    continue
                path = word.rstrip("/")
                if not SOURCES_HERE and (
                    path.endswith((".cpp", ".h")) or "csrc" in path.split("/")
                ):
                    continue  # C++ sources: in the sdist and the checkout, not in a wheel
                # Pages shorten paths inside the package (`backends/cpu/nms.py`).
                found = any(f == path or f.endswith("/" + path) for f in files)
                assert found or word in ABSENT_BY_DESIGN, f"{page.name}: no {word} here"
