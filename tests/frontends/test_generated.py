"""The list of ops and the frontends' per-op functions are generated from the op declarations
(:mod:`asickernels.frontends.generate`): the checked-in modules must be what it writes."""

from __future__ import annotations

import dataclasses

import asickernels
from asickernels.frontends import generate
from asickernels.kernels import nms as nms_module
from asickernels.kernels.declaration import Op


def test_the_generated_frontend_modules_are_up_to_date():
    stale = generate.stale()
    assert not stale, (
        f"{stale} differ from the op declarations: run python -m asickernels.frontends.generate"
    )


def test_a_changed_declaration_makes_its_frontends_stale(tmp_path, monkeypatch):
    for frontend in generate.GENERATED:
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


def test_the_list_of_ops_is_every_op_declared_in_a_kernels_module(monkeypatch):
    declared = [op for ops in generate.declared_ops().values() for op in ops]
    assert sorted(declared, key=lambda op: op.name) == list(asickernels.OPS)
    assert all(op.module.startswith("asickernels.kernels.") for op in declared)
    # A new op bound to its name in its module is listed, with nothing else written.
    new = Op("box_volume", [], check=None, compute=None, reference=None, doc="")
    new.module = nms_module.__name__
    monkeypatch.setattr(nms_module, "box_volume", new, raising=False)
    listing = generate.PUBLIC.region()
    assert "from asickernels.kernels.nms import batched_nms, box_volume, nms" in listing
    assert "    box_volume,\n" in listing.split("OPS: tuple[Op, ...] = (")[1]
