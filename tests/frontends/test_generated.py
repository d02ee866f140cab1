"""The frontends' per-op functions are generated from the op declarations
(:mod:`asickernels.frontends.generate`): the checked-in modules must be what it writes."""

from __future__ import annotations

import dataclasses

import asickernels
from asickernels.frontends import generate


def test_the_generated_frontend_modules_are_up_to_date():
    stale = generate.stale()
    assert not stale, (
        f"{stale} differ from the op declarations: run python -m asickernels.frontends.generate"
    )


def test_a_changed_declaration_makes_its_frontends_stale(tmp_path, monkeypatch):
    for frontend in generate.FRONTENDS:
        (tmp_path / frontend.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / frontend.path).write_text((generate.PACKAGE / frontend.path).read_text())
    assert generate.stale(tmp_path) == []
    giou = asickernels.giou
    renamed = dataclasses.replace(giou.params[1], name="other_boxes")
    monkeypatch.setattr(giou, "params", (giou.params[0], renamed))
    assert generate.stale(tmp_path) == [frontend.path for frontend in generate.FRONTENDS]
    assert generate.write(tmp_path) == [frontend.path for frontend in generate.FRONTENDS]
    assert generate.stale(tmp_path) == []
    assert (
        "def giou(boxes1: ArrayLike, other_boxes: ArrayLike, *"
        in (tmp_path / "torch/__init__.py").read_text()
    )


def test_check_exits_1_naming_a_stale_module(monkeypatch, capsys):
    monkeypatch.setattr(generate, "stale", lambda root=generate.PACKAGE: ["torch/__init__.py"])
    assert generate.main(["--check"]) == 1
    assert "stale: asickernels/torch/__init__.py" in capsys.readouterr().out
