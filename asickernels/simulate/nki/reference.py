"""The NKI API reference as data: every name of the current ``nki`` namespace, with the page
or file that documents it and the NKI releases that added, deprecated or removed it
(``reference.json``, next to this module).

The simulator derives its release warnings from this list: a function decorated with
:func:`deprecated` warns :class:`~asickernels.simulate.nki.errors.DeprecatedApiWarning`
with the releases the list records, and a name the simulator refuses raises
``NotImplementedError`` with the reason the list records (:func:`refuse`).
``tests/simulate/nki/test_nki_reference.py`` walks the list.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from asickernels.simulate.nki import errors

REFERENCE_FILE = Path(__file__).with_name("reference.json")
_SIMULATOR_DIR = str(Path(__file__).parent)
Function = TypeVar("Function", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Entry:
    """One name of the reference. ``added``/``deprecated``/``removed``: NKI versions ("0.7");
    ``replacement``: what the release notes say to use instead; ``owner``: the part of the
    project that simulates it; ``unsupported``: why the simulator refuses it, if it does."""

    name: str
    kind: str
    source: str
    added: str | None = None
    deprecated: str | None = None
    removed: str | None = None
    replacement: str | None = None
    owner: str = "nki-api"
    unsupported: str | None = None


@functools.cache
def releases() -> dict[str, str]:
    """NKI version -> the Neuron SDK release that shipped it."""
    return dict(json.loads(REFERENCE_FILE.read_text())["releases"])


@functools.cache
def entries() -> dict[str, Entry]:
    """Every name of the reference, by its dotted name (``nki.isa.topk``)."""
    data = json.loads(REFERENCE_FILE.read_text())
    listed = [Entry(**item) for item in data["entries"]]
    return {entry.name: entry for entry in listed}


def _release(version: str) -> str:
    sdk = releases().get(version)
    return f"NKI {version}" + (f" (Neuron {sdk})" if sdk else "")


def change_message(name: str) -> str:
    """How the reference records ``name`` changing: the releases and the replacement."""
    entry = entries()[name]
    steps = []
    if entry.deprecated:
        steps.append(f"deprecated in {_release(entry.deprecated)}")
    if entry.removed:
        steps.append(f"removed in {_release(entry.removed)}")
    if not steps:
        raise KeyError(f"{name} is not deprecated or removed in the reference")
    message = f"{name} was {' and '.join(steps)}"
    if entry.replacement:
        message += f"; use {entry.replacement}"
    return f"{message} ({entry.source}). The simulator runs it as the releases before did."


def warn_changed(name: str) -> None:
    """Warns that the kernel uses ``name``, which a later release deprecated or removed; the
    warning points at the kernel's line (the first caller outside the simulator)."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_SIMULATOR_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(change_message(name), errors.DeprecatedApiWarning, stacklevel=level)


def deprecated(name: str) -> Callable[[Function], Function]:
    """Decorates the simulator's ``name`` to warn, on every call, what the reference records
    about its deprecation or removal (the message is checked when the module loads)."""
    change_message(name)

    def decorate(function: Function) -> Function:
        @functools.wraps(function)
        def warning_first(*args: Any, **kwargs: Any) -> Any:
            warn_changed(name)
            return function(*args, **kwargs)

        return warning_first  # type: ignore[return-value]

    return decorate


def refuse(name: str) -> NoReturn:
    """Raises ``NotImplementedError`` naming ``name`` and why the simulator refuses it."""
    entry = entries()[name]
    if not entry.unsupported:
        raise KeyError(f"{name} is simulated according to the reference list")
    raise NotImplementedError(f"{name} is not simulated: {entry.unsupported} ({entry.source})")
