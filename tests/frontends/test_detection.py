"""torchvision's detection models made :func:`asickernels.torch.detection.xla_ready`: on
CPU their trimmed detections are torchvision's; on the torch_xla CPU device a forward pass
runs with no CPU fallback, compiles one graph per input shape after warm-up, and detects
what CPU torchvision detects. Small random-weight models (MobileNetV3-small FPN backbones,
fixed seeds, score thresholds 0 so that NMS has work). Runs in the torch_xla environment
(``make test-torch-xla``); skipped where torch is not installed."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from asickernels.testing import detection_models  # noqa: E402
from asickernels.torch import detection  # noqa: E402

# XLA's convolutions sum in another order than CPU torch's: scores move by ~1e-7 and
# boxes by ~1e-5 px (measured: <= 2e-7 and 3e-5 px here); the tolerances leave room for
# other CPUs' vector widths while still catching any wrong pick (boxes apart by pixels).
SCORE_TOL = 1e-5
BOX_TOL = 1e-3
# Mask R-CNN's masks: bilinear weights from boxes that moved by ~1e-5 px (measured <= 2.5e-6).
MASK_TOL = 1e-5
# SSD300's VGG16 and Mask R-CNN's graph take minutes on a loaded 2-core machine.
MODELS = [
    pytest.param(kind, marks=pytest.mark.slow) if kind in ("ssd", "mask_rcnn") else kind
    for kind in sorted(detection_models.BUILDERS)
]


def _rows(image):
    """An image's detections as float64 rows (score, label, x1, y1, x2, y2)."""
    return torch.cat(
        [image["scores"][:, None], image["labels"][:, None], image["boxes"]], 1
    ).double()


def assert_same_detections(expected, actual, score_tol=0.0, box_tol=0.0, mask_tol=MASK_TOL):
    """Per image: as many detections, each matched one to one with a detection of the same
    label whose score and box (and mask, for Mask R-CNN) are within the tolerances (any
    order among equal or, within the tolerance, near-equal scores)."""
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual, strict=True):
        assert set(got) == set(want)
        a, b = _rows(want), _rows(got)
        assert a.shape == b.shape
        close = (
            (a[:, None, 1] == b[None, :, 1])
            & ((a[:, None, 0] - b[None, :, 0]).abs() <= score_tol)
            & ((a[:, None, 2:] - b[None, :, 2:]).abs().amax(-1) <= box_tol)
        )
        free = torch.ones(len(b), dtype=torch.bool)
        for row in range(len(a)):
            candidates = torch.nonzero(close[row] & free).flatten()
            assert len(candidates) > 0, f"no match for detection {a[row].tolist()}"
            free[candidates[0]] = False
            if "masks" in want:
                mask_difference = (want["masks"][row] - got["masks"][candidates[0]]).abs().max()
                assert mask_difference <= mask_tol, f"detection {row}: masks {mask_difference}"


@pytest.mark.parametrize("kind", MODELS)
def test_cpu_detections_are_torchvisions(kind):
    model = detection_models.model(kind)
    images = detection_models.images_for(kind)
    with torch.no_grad():
        expected = model(images)
        padded = detection.xla_ready(copy.deepcopy(model))(images)
    for image in padded:
        assert image["boxes"].shape == (detection_models.detections_per_img(model), 4)
        count = int(image["num_detections"])
        assert (image["labels"][count:] == -1).all() and (image["scores"][count:] == 0).all()
    # RetinaNet and FCOS select with torchvision's own arithmetic: the very detections.
    # Faster and Mask R-CNN pool with asickernels' roi_align, whose float32 sums round in
    # another order than torchvision's C++: ~1e-7 in scores, ~3e-5 px in boxes.
    exact = kind not in ("faster_rcnn", "mask_rcnn")
    assert_same_detections(
        expected, detection.trim(padded), *((0.0, 0.0) if exact else (SCORE_TOL, BOX_TOL))
    )


def _compilations(metrics):
    data = metrics.metric_data("CompileTime")
    return 0 if data is None else data[0]


@pytest.mark.parametrize("kind", MODELS)
def test_xla_one_graph_without_fallbacks(kind):
    torch_xla = pytest.importorskip("torch_xla")
    metrics = pytest.importorskip("torch_xla.debug.metrics")
    device = torch_xla.device()
    model = detection_models.model(kind)
    images = detection_models.images_for(kind)
    ready = detection.xla_ready(copy.deepcopy(model)).to(device)
    torch_xla.sync()
    with torch.no_grad():
        expected = model(images)
        runs = []
        for batch in (images, [image.flip(-1) for image in images]):
            metrics.clear_all()
            padded = ready([image.to(device) for image in batch])
            # A CPU fallback counts as aten::<op> (torchvision::<op> for its custom ops);
            # a host sync (.item(), .cpu(), a data-dependent shape) as a transfer.
            fallbacks = [
                n for n in metrics.counter_names() if "::" in n and not n.startswith("xla::")
            ]
            assert fallbacks == []
            assert metrics.metric_data("TransferFromDeviceTime") is None
            runs.append(detection.trim(padded))
            compilations = _compilations(metrics)
        expected_flipped = model([image.flip(-1) for image in images])
    assert compilations == 0  # new data of the same shape: the first run's graph
    assert_same_detections(expected, runs[0], SCORE_TOL, BOX_TOL)
    assert_same_detections(expected_flipped, runs[1], SCORE_TOL, BOX_TOL)


@pytest.mark.parametrize("model", [torch.nn.Linear(2, 2), None], ids=["linear", "none"])
def test_other_models_are_refused(model):
    with pytest.raises(TypeError, match=r"model must be .*RetinaNet, FCOS, SSD, Faster and Mask"):
        detection.xla_ready(model)


@pytest.mark.parametrize(("backend", "error"), [(3, TypeError), ("no_such", ValueError)])
def test_a_backend_that_is_no_name_is_refused(backend, error):
    with pytest.raises(error, match="backend"):
        detection.xla_ready(detection_models.model("retinanet"), backend=backend)


@pytest.mark.parametrize(
    ("detections", "error"),
    [(None, TypeError), ([None], TypeError), ([{"boxes": torch.zeros(2, 4)}], ValueError)],
)
def test_trim_refuses_what_no_ready_model_returns(detections, error):
    with pytest.raises(error, match="detections"):
        detection.trim(detections)
