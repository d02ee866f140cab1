"""``asickernels.torch.vision`` as a drop-in for ``torchvision.ops``: torchvision's own tests
(the corpus copies, ``../shared/corpus/torchvision``) run against it, and the IoU matrices
and losses that upstream's TestBoxIou, TestDistanceBoxIoU, TestCompleteBoxIou and their loss
classes cover are checked here against torchvision itself (dtypes, TorchScript, every pair,
losses, reductions, empty inputs), plus float64 agreement on random and edge boxes. Runs in
the torch environment (``make test-torch-xla``); skipped where torch is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tvo = pytest.importorskip("torchvision.ops")
try:
    import torch_xla

    # Before any backward pass: the autograd engine counts each device type's devices once.
    torch_xla.device()
except ImportError:
    pass

from conftest import SHARED, VENDOR, VENDOR_MISSING  # noqa: E402

from asickernels.kernels.cases import random_boxes  # noqa: E402
from asickernels.kernels.giou_cases import giou_cases  # noqa: E402
from asickernels.torch import vision  # noqa: E402

TESTS = Path(__file__).resolve().parent
CORPUS = SHARED / "corpus" / "torchvision"
PAIRWISE = ("box_iou", "generalized_box_iou", "distance_box_iou", "complete_box_iou")
LOSSES = ("generalized_box_iou_loss", "distance_box_iou_loss", "complete_box_iou_loss")
# Boxes whose IoU matrices upstream checks: integer boxes (one nested in another), and three
# large, heavily overlapping float boxes.
INT_BOXES = [[0, 0, 100, 100], [0, 0, 50, 50], [200, 200, 300, 300], [0, 0, 25, 25]]
FLOAT_BOXES = [
    [285.3538, 185.5758, 1193.5110, 851.4551],
    [285.1472, 188.7374, 1192.4984, 851.0669],
    [279.2440, 197.9812, 1189.4746, 849.2019],
]


def _ours(name):
    return getattr(vision, name)


def _theirs(name):
    return getattr(tvo, name)


# torchvision's own tests --------------------------------------------------------------------


def _run_pytest(tmp_path: Path, peer: str, args: list[str]) -> tuple[dict[str, str], str]:
    """Runs pytest on the test files copied into ``tmp_path`` in a fresh process (the corpus
    conftest swaps in the peer's ops at import) and returns each test's outcome (``passed``,
    ``failed``, ``error`` or ``skipped``, by ``Class::test[params]``) and pytest's output."""
    (tmp_path / "adapters.py").write_text(
        "from torchvision_adapters import OPCHECK_NAMESPACE, PEER, install  # noqa: F401\n"
    )
    report = tmp_path / "report.xml"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), str(tmp_path)]),
        ASICKERNELS_TORCHVISION_PEER=peer,
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        + args,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = done.stdout[-6000:] + done.stderr[-3000:]
    assert report.exists(), output
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "").rpartition(".")[2] + "::" + case.get("name", "")
        found = [tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None]
        outcomes[name] = {"failure": "failed"}.get(found[0], found[0]) if found else "passed"
    return outcomes, output


def _count(outcomes: dict[str, str]) -> dict[str, int]:
    return {k: list(outcomes.values()).count(k) for k in ("passed", "failed", "error", "skipped")}


def _run_corpus(tmp_path: Path, peer: str) -> dict[str, int]:
    """Runs the corpus copies of torchvision's tests against ``peer``; returns the counts."""
    if not CORPUS.is_dir():
        pytest.skip(f"the torchvision test corpus is absent ({CORPUS})")
    for source in CORPUS.glob("*.py"):
        shutil.copy(source, tmp_path)
    # The tests read an opcheck failures dict beside them: upstream's, without its entries
    # (all for roi_align/roi_pool, which the copies do not test).
    upstream = json.loads((CORPUS / "optests_failures_dict.upstream.json").read_text())
    empty = {"_description": upstream["_description"], "_version": upstream["_version"], "data": {}}
    (tmp_path / "optests_failures_dict.json").write_text(
        json.dumps(empty, indent=2, sort_keys=True) + "\n"
    )
    outcomes, output = _run_pytest(tmp_path, peer, ["test_ops_tv.py"])
    counts = _count(outcomes)
    print(f"torchvision's tests against {peer}: {counts}")
    assert counts["failed"] == 0 and counts["error"] == 0, output
    return counts


def test_torchvisions_own_tests_pass_against_asickernels(tmp_path):
    counts = _run_corpus(tmp_path, "asickernels")
    # Skipped: CUDA/MPS-only tests and the quantized-tensor NMS tests (corpus conftest).
    assert counts["passed"] >= 62


# Upstream's own TestRoIAlign, TestRoiPool and TestMultiScaleRoIAlign (test/test_ops.py up to
# TestNMS, verbatim; tests/fetch_vendor.py fetches it), run unchanged on CPU against torchvision (the control)
# and against the drop-in; CUDA/MPS tests skip as upstream skips them.
VENDORED_VISION = VENDOR / "vision@00673be" / "test"
ROI_CLASSES = "TestRoIAlign or TestRoiPool or TestMultiScaleRoIAlign"
SCRIPTING = (
    "torch.jit.script of the drop-in fails (TorchScript rejects list() of the Union "
    "output_size in vision._pool); test_backward scripts the op before its gradcheck, so "
    "upstream's gradcheck does not run here (the gradcheck tests below cover the same inputs)"
)
# Upstream RoI tests that fail against the drop-in, by test (any parameters), and why. The
# test below checks that each still fails, so the list cannot go stale.
ROI_EXCLUSIONS = {
    "TestRoIAlign::test_qroialign": "quantized tensors: asickernels takes float tensors only",
    "TestRoIAlign::test_qroi_align_multiple_images": "quantized tensors (as test_qroialign)",
    "TestRoIAlign::test_backward": SCRIPTING,
    "TestRoiPool::test_backward": SCRIPTING,
    "TestRoIAlign::test_jit_boxes_list": SCRIPTING,
    "TestRoiPool::test_jit_boxes_list": SCRIPTING,
    "TestRoiPool::test_torch_fx_trace": (
        "a gap: torch.fx.symbolic_trace of vision.RoIPool hands roi_pool a Proxy (torchvision "
        "registers its roi_pool with torch.fx.wrap; a module-level wrap of ours did not suffice)"
    ),
}


def _run_upstream_roi_tests(tmp_path: Path, peer: str) -> dict[str, str]:
    if not CORPUS.is_dir() or not VENDORED_VISION.is_dir():
        pytest.skip(f"torchvision's test files are absent ({CORPUS}): {VENDOR_MISSING}")
    run = tmp_path / peer
    run.mkdir()
    for source in [CORPUS / "conftest.py", CORPUS / "common_utils.py"]:
        shutil.copy(source, run)
    for name in ("test_ops.py", "optests_failures_dict.json"):  # test_ops reads the json
        shutil.copy(VENDORED_VISION / name, run)
    outcomes, output = _run_pytest(run, peer, ["-k", ROI_CLASSES, "test_ops.py"])
    print(f"upstream's RoI tests against {peer}: {_count(outcomes)}")
    assert outcomes, output
    return outcomes


@pytest.mark.slow  # two pytest subprocesses over torchvision's RoI tests (~1 min)
def test_torchvisions_own_roi_tests_pass_against_asickernels(tmp_path):
    control = _run_upstream_roi_tests(tmp_path, "torchvision")
    ours = _run_upstream_roi_tests(tmp_path, "asickernels")
    assert sorted(control) == sorted(ours)
    assert _count(control)["failed"] == _count(control)["error"] == 0
    excluded = {name for name in ours if name.partition("[")[0] in ROI_EXCLUSIONS}
    differ = {name for name in ours if ours[name] != control[name] and name not in excluded}
    assert not differ, {name: (control[name], ours[name]) for name in sorted(differ)}
    still_failing = {name.partition("[")[0] for name in excluded if ours[name] == "failed"}
    assert still_failing == set(ROI_EXCLUSIONS), "drop the exclusions that now pass"
    ran = {name for name in ours if ours[name] == "passed"}
    assert any("TestRoIAlign::test_forward" in n for n in ran) and len(ran) >= 25


# Upstream's IoU-matrix checks, with torchvision as the oracle --------------------------------


@pytest.mark.parametrize("name", PAIRWISE)
@pytest.mark.parametrize(
    "boxes, dtypes, atol",
    [
        (INT_BOXES, (torch.int16, torch.int32, torch.int64), 1e-4),
        (FLOAT_BOXES, (torch.float16,), 2e-3),
        (FLOAT_BOXES, (torch.float32, torch.float64), 1e-3),
    ],
    ids=["int", "float16", "float32_64"],
)
def test_iou_matrix_for_each_dtype_matches_torchvision(name, boxes, dtypes, atol):
    for dtype in dtypes:
        boxes1 = torch.tensor(boxes, dtype=dtype)
        boxes2 = boxes1[:3]
        got = _ours(name)(boxes1, boxes2)
        assert got.shape == (len(boxes), 3) and got.is_floating_point()
        want = _theirs(name)(boxes1, boxes2)
        assert got.dtype == want.dtype, "integer and float16 boxes are upcast as torchvision does"
        torch.testing.assert_close(got, want, rtol=0.0, atol=atol, check_dtype=False)


@pytest.mark.parametrize("name", PAIRWISE)
def test_iou_matrix_is_torchscript_scriptable(name):
    boxes = torch.tensor(INT_BOXES, dtype=torch.float)
    scripted = torch.jit.script(_ours(name))
    torch.testing.assert_close(scripted(boxes, boxes), _ours(name)(boxes, boxes))


@pytest.mark.parametrize("name", PAIRWISE)
def test_iou_matrix_entries_are_the_single_pair_values(name):
    generator = torch.Generator().manual_seed(0)
    xy = torch.rand((12, 2), generator=generator)
    boxes = torch.cat([xy, xy + torch.rand((12, 2), generator=generator)], dim=1)
    boxes1, boxes2 = boxes[:5], boxes[5:]
    matrix = _ours(name)(boxes1, boxes2)
    single = torch.stack(
        [
            torch.cat([_ours(name)(boxes1[i : i + 1], boxes2[j : j + 1])[0] for j in range(7)])
            for i in range(5)
        ]
    )
    torch.testing.assert_close(matrix, single)


def _loss_boxes(dtype):
    """A 2x2 box, a unit box inside it, the unit boxes above and diagonally beside that one."""
    box1 = torch.tensor([-1, -1, 1, 1], dtype=dtype)
    box2 = torch.tensor([0, 0, 1, 1], dtype=dtype)
    box3 = torch.tensor([0, 1, 1, 2], dtype=dtype)
    box4 = torch.tensor([1, 1, 2, 2], dtype=dtype)
    return box1, box2, box3, box4, torch.stack([box2, box2]), torch.stack([box3, box4])


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.half])
def test_loss_values_and_reductions_match_torchvision(name, dtype):
    box1, box2, box3, box4, pairs1, pairs2 = _loss_boxes(dtype)
    ours, theirs = _ours(name), _theirs(name)
    assert ours(box1, box1).item() == pytest.approx(0.0, abs=1e-6)
    for a, b in ((box1, box2), (box1, box3), (box1, box4), (box2, box3), (box2, box4)):
        got = ours(a, b)
        assert got.dtype == torch.float32 and got.shape == ()
        torch.testing.assert_close(got, theirs(a, b).float(), rtol=0, atol=1e-4)
    for reduction in ("none", "sum", "mean"):
        got = ours(pairs1, pairs2, reduction=reduction)
        want = theirs(pairs1, pairs2, reduction=reduction).float()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="Invalid"):
        ours(pairs1, pairs2, reduction="xyz")


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.half])
def test_loss_of_no_boxes_is_zero_and_differentiable(name, dtype):
    box1 = torch.randn([0, 4], dtype=dtype).requires_grad_()
    box2 = torch.randn([0, 4], dtype=dtype).requires_grad_()
    loss = _ours(name)(box1, box2, reduction="mean")
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(0.0))
    assert box1.grad is not None and box2.grad is not None
    assert _ours(name)(box1, box2, reduction="none").numel() == 0


# Agreement with torchvision in float64 -----------------------------------------------------


RANDOM = 300


def _random_and_edge_boxes():
    """Random boxes and GIOU's adversarial pairs without zero-area boxes (torchvision
    divides 0 by 0 on those; see test_degenerate_boxes_are_finite_where_torchvision_is_nan)
    and without the 4e-3-wide "tiny_boxes", where eps = 1e-7 is 0.5% of the union."""
    rng = np.random.default_rng(21)
    first, second = random_boxes(rng, (RANDOM,)), random_boxes(rng, (RANDOM,))
    adversarial = next(c for c in giou_cases() if c.name == "adversarial")
    area = lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])  # noqa: E731
    proper = (area(adversarial.boxes1) > 1e-3) & (area(adversarial.boxes2) > 1e-3)
    first = np.concatenate([first, adversarial.boxes1[proper]])
    second = np.concatenate([second, adversarial.boxes2[proper]])
    return torch.tensor(first, dtype=torch.float64), torch.tensor(second, dtype=torch.float64)


# |ours - torchvision| in float64: only eps = 1e-7 in the denominators differs (about
# 1e-7 / union; measured: 1e-7 for values, see the printed figures).
AGREEMENT = {"pairwise": 1e-6, "loss": 1e-6, "gradient": 1e-5}


@pytest.mark.parametrize("name", PAIRWISE)
def test_iou_matrices_agree_with_torchvision_in_float64(name):
    boxes1, boxes2 = _random_and_edge_boxes()
    got, want = _ours(name)(boxes1, boxes2), _theirs(name)(boxes1, boxes2)
    assert got.dtype == torch.float64
    error = (got - want).abs().max().item()
    print(f"{name}: max |ours - torchvision| = {error:.3g} over {got.numel()} pairs")
    assert error <= AGREEMENT["pairwise"]


@pytest.mark.parametrize("name", LOSSES)
def test_losses_and_gradients_agree_with_torchvision_in_float64(name):
    """Values on random and edge boxes; gradients on the random boxes only: where two
    coordinates tie (identical, touching, nested-with-a-shared-edge boxes) torch's
    ``max``/``min`` split the gradient between both boxes, asickernels gives it to
    ``boxes1`` (its documented tie rule)."""
    boxes1, boxes2 = _random_and_edge_boxes()
    loss_error, _ = _loss_and_gradient_errors(name, boxes1, boxes2)
    _, grad_error = _loss_and_gradient_errors(name, boxes1[:RANDOM], boxes2[:RANDOM])
    print(f"{name}: max |loss diff| = {loss_error:.3g}, max |gradient diff| = {grad_error:.3g}")
    assert loss_error <= AGREEMENT["loss"] and grad_error <= AGREEMENT["gradient"]


def _loss_and_gradient_errors(name, boxes1, boxes2):
    cotangent = torch.tensor(np.random.default_rng(22).normal(size=len(boxes1)))
    grads = []
    for function in (_ours(name), _theirs(name)):
        preds = boxes1.clone().requires_grad_()
        targets = boxes2.clone().requires_grad_()
        loss = function(preds, targets)
        (loss * cotangent).sum().backward()
        grads.append((loss.detach(), preds.grad, targets.grad))
    (loss, d1, d2), (want, w1, w2) = grads
    assert loss.dtype == torch.float64
    grad_error = max((d1 - w1).abs().max().item(), (d2 - w2).abs().max().item())
    return (loss - want).abs().max().item(), grad_error


@pytest.mark.parametrize("name", PAIRWISE)
def test_degenerate_boxes_are_finite_where_torchvision_is_nan(name):
    """Documented difference: eps keeps 0 / 0 (two zero-area boxes) finite."""
    points = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 4.0, 1.0]], dtype=torch.float64)
    got = _ours(name)(points, points)
    assert torch.isfinite(got).all()
    assert torch.isnan(_theirs(name)(points, points)).any()


def test_nms_and_batched_nms_match_torchvision():
    generator = torch.Generator().manual_seed(3)
    xy = torch.rand((500, 2), generator=generator) * 100
    boxes = torch.cat([xy, xy + torch.rand((500, 2), generator=generator) * 30], dim=1)
    scores = torch.rand(500, generator=generator)
    idxs = torch.randint(0, 5, (500,), generator=generator)
    for iou in (0.1, 0.5, 0.9):
        keep = vision.nms(boxes, scores, iou)
        assert keep.dtype == torch.int64
        torch.testing.assert_close(keep, tvo.nms(boxes, scores, iou))
        torch.testing.assert_close(
            vision.batched_nms(boxes, scores, idxs, iou), tvo.batched_nms(boxes, scores, idxs, iou)
        )


def test_batched_nms_of_no_boxes_is_empty_whatever_the_other_shapes_as_torchvision():
    for boxes, scores, idxs in (
        (torch.zeros(0, 4), torch.zeros(0), torch.zeros(0)),
        (torch.zeros(0), torch.zeros(3), torch.zeros(2)),
    ):
        want = tvo.batched_nms(boxes, scores, idxs, 0.5)
        assert torch.equal(vision.batched_nms(boxes, scores, idxs, 0.5), want)
    # torchvision's own test: the other arguments are not read at all.
    empty = torch.empty((0,), dtype=torch.int64)
    assert torch.equal(vision.batched_nms(empty, None, None, None), empty)


def test_bad_inputs_raise_runtime_error_as_torchvision():
    for boxes, scores in (
        (torch.rand(4), torch.rand(3)),
        (torch.rand(3, 5), torch.rand(3)),
        (torch.rand(3, 4), torch.rand(3, 2)),
        (torch.rand(3, 4), torch.rand(4)),
    ):
        with pytest.raises(RuntimeError):
            vision.nms(boxes, scores, 0.5)
    with pytest.raises(ValueError, match="eps"):
        vision.complete_box_iou_loss(torch.rand(2, 4), torch.rand(2, 4), eps=1e-3)


def test_xla_tensors():
    torch_xla = pytest.importorskip("torch_xla")
    device = torch_xla.device()
    pairs1, pairs2 = (torch.tensor(random_boxes(np.random.default_rng(s), (5,))) for s in (1, 2))
    preds = pairs1.to(device).requires_grad_()
    loss = vision.complete_box_iou_loss(preds, pairs2.to(device), reduction="sum")
    loss.backward()
    want_preds = pairs1.clone().requires_grad_()
    want = tvo.complete_box_iou_loss(want_preds, pairs2, reduction="sum")
    want.backward()
    torch.testing.assert_close(loss.cpu(), want.detach(), atol=1e-4, rtol=0)
    torch.testing.assert_close(preds.grad.cpu(), want_preds.grad, atol=1e-4, rtol=1e-4)
    boxes = torch.tensor(INT_BOXES, dtype=torch.float)
    torch.testing.assert_close(
        vision.generalized_box_iou(boxes.to(device), boxes.to(device)).cpu(),
        tvo.generalized_box_iou(boxes, boxes),
    )
    keep = vision.nms(boxes.to(device), torch.tensor([0.9, 0.8, 0.7, 0.6]).to(device), 0.2)
    torch.testing.assert_close(keep.cpu(), tvo.nms(boxes, torch.tensor([0.9, 0.8, 0.7, 0.6]), 0.2))


# The new torch.ops.asickernels operators ---------------------------------------------------


def _box_op_cases():
    rng = np.random.default_rng(30)
    b1 = torch.tensor(random_boxes(rng, (2, 5))).requires_grad_()
    b2 = torch.tensor(random_boxes(rng, (2, 7)))
    p2 = torch.tensor(random_boxes(rng, (2, 5)))
    mask = torch.arange(10).reshape(2, 5) % 3 != 0
    ops = torch.ops.asickernels
    return {
        "box_iou": (ops.box_iou, (b1.detach(), b2), {}),  # no gradient (see vision's docs)
        "generalized_box_iou": (ops.generalized_box_iou, (b1, b2), {}),
        "generalized_box_iou_float64": (
            ops.generalized_box_iou,
            (b1.detach().double().requires_grad_(), b2.double()),
            {},
        ),
        "diou": (ops.diou, (b1, p2), {}),
        "ciou": (ops.ciou, (b1, p2), {}),
        "diou_loss": (ops.diou_loss, (b1, p2, mask), {"reduction": "mean"}),
        "ciou_loss": (ops.ciou_loss, (b1, p2, mask), {"reduction": "sum"}),
        "ciou_vjp": (ops.ciou_vjp, (b1.detach(), p2, torch.ones(2, 5)), {}),
    }


@pytest.mark.parametrize("name", list(_box_op_cases()))
def test_box_ops_pass_opcheck(name):
    op, args, kwargs = _box_op_cases()[name]
    torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize(
    "name", ["generalized_box_iou", "distance_box_iou", "distance_box_iou_loss"]
)
def test_float64_gradients_pass_gradcheck(name):
    """(CIoU is left out: its ``alpha`` is held constant, as torchvision holds it, so its
    gradient is not the numerical derivative; it is compared with torchvision's above.)"""
    rng = np.random.default_rng(31)
    b1 = torch.tensor(random_boxes(rng, (4,)), dtype=torch.float64).requires_grad_()
    b2 = torch.tensor(random_boxes(rng, (4,)), dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(_ours(name), (b1, b2))


# roi_align, MultiScaleRoIAlign ---------------------------------------------------------------
# The checks upstream's TestRoIAlign and TestMultiScaleRoIAlign make (the corpus holds no copy
# of them), with torchvision's own kernels as the oracle: the same RoIs, dtypes, strides,
# sampling modes, gradcheck settings and box formats.

UPSTREAM_ROIS = [[0, 0, 0, 9, 9], [0, 0, 5, 4, 9], [0, 5, 5, 9, 9], [1, 0, 0, 9, 9]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_matches_torchvision(dtype, contiguous, aligned, sampling_ratio):
    torch.manual_seed(0)
    x = torch.rand(2, 50, 10, 10, dtype=dtype)
    if not contiguous:
        x = x.permute(0, 1, 3, 2)
    rois = torch.tensor(UPSTREAM_ROIS, dtype=dtype)
    args = (5, 0.5 if aligned else 1.0, sampling_ratio, aligned)
    got = vision.roi_align(x, rois, *args)
    want = tvo.roi_align(x, rois, *args)
    assert got.dtype == x.dtype and got.shape == (4, 50, 5, 5)
    tol = 4e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # Per-image [L, 4] boxes are the same RoIs.
    per_image = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    torch.testing.assert_close(vision.roi_align(x, per_image, *args), want, rtol=tol, atol=tol)


def test_multiscale_roi_align_matches_torchvision():
    torch.manual_seed(0)
    features = {"0": torch.rand(2, 4, 40, 48), "1": torch.rand(2, 4, 20, 24)}
    features["2"] = torch.rand(2, 4, 10, 12)
    corners = torch.rand(2, 30, 2) * torch.tensor([190.0, 150.0])
    sizes = torch.rand(2, 30, 2) ** 2 * 400  # up to past the image: every level
    boxes = list(torch.cat([corners, corners + sizes], -1))
    image_shapes = [(160, 192), (150, 180)]
    theirs = tvo.MultiScaleRoIAlign(["0", "1", "2"], 7, 2)
    ours = vision.MultiScaleRoIAlign(["0", "1", "2"], 7, 2)
    want = theirs(features, boxes, image_shapes)
    assert len(set(theirs.map_levels(boxes).tolist())) == 3  # every level pools something
    torch.testing.assert_close(ours(features, boxes, image_shapes), want, rtol=1e-5, atol=1e-6)


def _random_rois(count, batch, span, dtype, seed):
    """Random RoIs over ``[-0.3, 1.3] * span`` (partly off the map, some tiny)."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 4, generator=generator, dtype=torch.float64) * 1.6 * span
    corners -= 0.3 * span
    boxes = torch.cat(
        [corners[:, :2].minimum(corners[:, 2:]), corners[:, :2].maximum(corners[:, 2:])], 1
    )
    index = torch.randint(0, batch, (count, 1), generator=generator).to(torch.float64)
    return torch.cat([index, boxes], 1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cpu_roi_align_is_torchvisions_bit_for_bit(dtype):
    """On CPU tensors the drop-in runs the cpu backend, whose kernel is torchvision's
    arithmetic in torchvision's order: the same bits, forward and gradient."""
    torch.manual_seed(1)
    x = torch.randn(2, 16, 23, 31, dtype=dtype)
    rois = _random_rois(120, 2, 30.0, dtype, seed=2)
    for args in [
        (7, 0.5, -1, False),
        ((3, 5), 1.0, 2, True),
        (4, 0.25, 0, True),
        (2, 1.0, 1, False),
    ]:
        ours_x, theirs_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, theirs = vision.roi_align(ours_x, rois, *args), tvo.roi_align(theirs_x, rois, *args)
        assert torch.equal(ours, theirs), args
        cotangent = torch.randn_like(ours)
        ours.backward(cotangent)
        theirs.backward(cotangent)
        assert torch.equal(ours_x.grad, theirs_x.grad), args


# roi_pool, RoIPool ---------------------------------------------------------------------------
# The checks of upstream's TestRoiPool (forward on the same RoIs, dtypes and strides, per-image
# box lists, gradcheck on the same inputs), with torchvision's own kernel as the oracle.


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("contiguous", [True, False])
def test_roi_pool_matches_torchvision(dtype, contiguous):
    torch.manual_seed(0)
    x = torch.rand(2, 50, 10, 10, dtype=dtype)
    if not contiguous:
        x = x.permute(0, 1, 3, 2)
    rois = torch.tensor(UPSTREAM_ROIS, dtype=dtype)
    for size, scale in ((5, 1.0), ((3, 4), 0.5), (2, 0.3)):
        want = tvo.roi_pool(x, rois, size, scale)
        got = vision.roi_pool(x, rois, size, scale)
        assert got.dtype == x.dtype and got.shape == want.shape
        assert torch.equal(got, want), (size, scale)
        per_image = [rois[rois[:, 0] == i, 1:] for i in range(2)]
        assert torch.equal(vision.roi_pool(x, per_image, size, scale), want)
        assert torch.equal(vision.RoIPool(size, scale)(x, rois), tvo.RoIPool(size, scale)(x, rois))


def test_roi_pool_matches_torchvision_on_random_and_edge_rois():
    """Ties, NaN, RoIs partly and wholly off the map, zero-size and reversed RoIs, bins
    smaller than a pixel, fractional scales: the same values and the same gradient."""
    torch.manual_seed(2)
    x = torch.randn(2, 6, 13, 17)
    x[0, 0, 3:6, 3:6] = 1.0  # a tie: the first maximum (row-major) takes the gradient
    x[1, 2, 2, 2] = float("nan")  # never a maximum
    rois = torch.cat(
        [
            _random_rois(60, 2, 18.0, torch.float32, seed=3),
            torch.tensor(
                [[0, 0, 0, 0, 0], [1, 5, 3, 5, 3], [0, 6, 6, 2, 1], [1, -30, -30, -20, -20]],
                dtype=torch.float32,
            ),
        ]
    )
    for size, scale in (((7, 7), 1.0), ((3, 4), 0.5), (1, 0.3), ((2, 5), 1.7)):
        ours_x, theirs_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours = vision.roi_pool(ours_x, rois, size, scale)
        theirs = tvo.roi_pool(theirs_x, rois, size, scale)
        assert torch.equal(ours, theirs), (size, scale)
        cotangent = torch.randn_like(ours)
        ours.backward(cotangent)
        theirs.backward(cotangent)
        torch.testing.assert_close(ours_x.grad, theirs_x.grad, rtol=0, atol=1e-6)


# roi_align and roi_pool: gradient and refusals ------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize(
    ("op", "gradcheck_args", "args", "atol"),
    [("roi_align", (2, 1.0, 1), (2, 1.0, -1), 1e-12), ("roi_pool", (2, 1.0), (2, 1.0), 0)],
)
def test_roi_op_gradient_passes_gradcheck_and_matches_torchvision(
    seed, contiguous, op, gradcheck_args, args, atol
):
    """float64 gradients pass gradcheck (at ``gradcheck_args``) and equal torchvision's at
    ``args`` within ``atol``."""
    ours_op, theirs_op = getattr(vision, op), getattr(tvo, op)
    torch.manual_seed(seed)
    x = torch.rand(1, 8, 5, 5, dtype=torch.float64, requires_grad=True)
    if not contiguous:
        x = x.permute(0, 1, 3, 2)
    rois = torch.tensor([[0, 0, 0, 4, 4], [0, 0, 2, 3, 4], [0, 2, 2, 4, 4]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda z: ours_op(z, rois, *gradcheck_args), (x,))
    cotangent = torch.rand(3, 8, 2, 2, dtype=torch.float64)
    (ours,) = torch.autograd.grad(ours_op(x, rois, *args), x, cotangent)
    (theirs,) = torch.autograd.grad(theirs_op(x, rois, *args), x, cotangent)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)


@pytest.mark.parametrize("op", ["roi_align", "roi_pool"])
def test_roi_op_refuses_misshapen_boxes_as_torchvision(op):
    x = torch.linspace(1, 64, 64).reshape(1, 1, 8, 8)
    for boxes in (torch.tensor([[0, 0, 3, 3]], dtype=x.dtype), [torch.tensor([[0, 0, 3]])]):
        with pytest.raises(AssertionError):
            getattr(tvo, op)(x, boxes, output_size=(2, 2))
        with pytest.raises(AssertionError):
            getattr(vision, op)(x, boxes, output_size=(2, 2))
    with pytest.raises(ValueError, match="output_size"):
        getattr(vision, op)(x, torch.zeros(1, 5), output_size=(2, 0))


# roi_align and roi_pool on XLA tensors ------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "args", "tolerance", "grad_tolerance"),
    [
        ("roi_align", (3, 1.0, -1, True), (1e-5, 1e-5), (1e-5, 1e-5)),
        ("roi_pool", (3, 0.5), (0, 0), (0, 1e-6)),  # max pooling: the same values exactly
    ],
)
def test_roi_op_on_xla_tensors_without_fallbacks(op, args, tolerance, grad_tolerance):
    """Forward and gradient on XLA tensors run no aten fallback and match torchvision's
    CPU kernel at ``(rtol, atol) = tolerance`` (``grad_tolerance`` for the gradient)."""
    torch_xla = pytest.importorskip("torch_xla")
    metrics = pytest.importorskip("torch_xla.debug.metrics")
    torch.manual_seed(0)
    x = torch.rand(2, 6, 10, 10, dtype=torch.float32)
    rois = torch.tensor(UPSTREAM_ROIS, dtype=torch.float32)
    cotangent = torch.rand(4, 6, 3, 3)
    device = torch_xla.device()
    metrics.clear_all()
    on_device = x.to(device).requires_grad_()
    out = getattr(vision, op)(on_device, rois.to(device), *args)
    (grad,) = torch.autograd.grad(out, on_device, cotangent.to(device))
    out, grad = out.cpu(), grad.cpu()
    assert [n for n in metrics.counter_names() if n.startswith("aten::")] == []
    leaf = x.clone().requires_grad_()
    want = getattr(tvo, op)(leaf, rois, *args)
    (want_grad,) = torch.autograd.grad(want, leaf, cotangent)
    rtol, atol = tolerance
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    rtol, atol = grad_tolerance
    torch.testing.assert_close(grad, want_grad, rtol=rtol, atol=atol)


# Every argument given as None -------------------------------------------------------------
_BOXES = torch.tensor([[0.0, 0.0, 4.0, 4.0], [1.0, 1.0, 5.0, 5.0]])
_PAIR = {"boxes1": _BOXES, "boxes2": _BOXES}
_ROI = {"input": torch.rand(1, 2, 8, 8), "boxes": torch.tensor([[0.0, 0, 0, 4, 4]])}
_VALID_CALLS = {
    "nms": {"boxes": _BOXES, "scores": torch.tensor([0.9, 0.8]), "iou_threshold": 0.5},
    "batched_nms": {
        "boxes": _BOXES,
        "scores": torch.tensor([0.9, 0.8]),
        "idxs": torch.tensor([0, 1]),
        "iou_threshold": 0.5,
    },
    **{name: _PAIR for name in ("box_iou", "generalized_box_iou")},
    **{name: {**_PAIR, "eps": 1e-7} for name in ("distance_box_iou", "complete_box_iou")},
    **{name: {**_PAIR, "reduction": "sum", "eps": 1e-7} for name in LOSSES},
    "roi_align": {**_ROI, "output_size": 2, "spatial_scale": 1.0, "sampling_ratio": 2},
    "roi_pool": {**_ROI, "output_size": 2, "spatial_scale": 1.0},
}
_VALID_CALLS["roi_align"]["aligned"] = True


@pytest.mark.parametrize(
    ("function", "name"),
    [(function, name) for function, kwargs in _VALID_CALLS.items() for name in kwargs],
)
def test_every_argument_given_as_none_is_refused_by_name(function, name):
    """A TypeError or ValueError naming the argument, where torchvision raises an
    AttributeError or a TypeError naming nothing."""
    kwargs = dict(_VALID_CALLS[function])
    _ours(function)(**kwargs)
    kwargs[name] = None
    with pytest.raises((TypeError, ValueError), match=name):
        _ours(function)(**kwargs)


def test_a_none_in_per_image_boxes_is_refused_by_name():
    with pytest.raises(TypeError, match=r"boxes\[1\]"):
        vision.roi_align(torch.rand(2, 2, 8, 8), [torch.zeros(1, 4), None], 2)


@pytest.mark.parametrize("name", ["x", "boxes", "image_shapes"])
def test_multiscale_roi_align_refuses_none_by_name(name):
    arguments = {
        "x": {"0": torch.rand(1, 2, 8, 8)},
        "boxes": [torch.tensor([[0.0, 0.0, 4.0, 4.0]])],
        "image_shapes": [(32, 32)],
    }
    pooler = vision.MultiScaleRoIAlign(["0"], 2, 2)
    pooler(**arguments)
    with pytest.raises(TypeError, match=name):
        pooler(**{**arguments, name: None})
