"""torchvision's detection models made :func:`asickernels.torch.detection.xla_ready` in graph
mode on CPU: ``torch._dynamo.explain`` finds no graph break, ``torch.compile(fullgraph=True)``
detects what eager mode detects, and ``torch.export`` exports each model into one program
(the post-processing as ``torch.ops.asickernels`` operators) that detects it too. Small
random-weight models (``asickernels.testing.detection_models``), two images of 128-160 px.
Runs in the torch_xla environment (``make test-torch-xla``); skipped where torch is not
installed.

``torch.compile`` runs with the ``aot_eager`` backend: dynamo's capture and AOTAutograd's
tracing through the operators' fake kernels, which is what a graph-mode backend (Inductor,
TorchTPU) is given; Inductor's C++ code generation takes ~5 min per model on this 2-core
machine and tests torch, not these models."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from asickernels.testing import detection_models  # noqa: E402
from asickernels.torch import detection  # noqa: E402

SHAPES = ((128, 160), (160, 128))
# AOTAutograd's decompositions sum in another order than eager torch: scores move by
# ~1e-7, boxes by ~3e-5 px (measured); the models' kept scores lie >= 2.5e-6 apart, so
# the detections keep their order and any wrong pick is far outside these tolerances.
TOLERANCES = {"scores": 1e-5, "boxes": 1e-3, "masks": 1e-5}
# SSD300's VGG16 and Mask R-CNN take the longest to trace (see the durations in the report).
MODELS = [
    pytest.param(kind, marks=pytest.mark.slow) if kind in ("ssd", "mask_rcnn") else kind
    for kind in sorted(detection_models.BUILDERS)
]


@functools.cache
def _case(kind: str) -> tuple[torch.nn.Module, list, list]:
    """``kind`` made xla_ready, its images, and its eager detections on them."""
    model = detection.xla_ready(detection_models.model(kind))
    images = detection_models.images(shapes=SHAPES)
    with torch.no_grad():
        return model, images, model(images)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test traces from scratch (no cache from another test's model)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_same_padded_detections(expected, actual):
    """Per image: the same padded detections (labels and counts exactly, the floats within
    :data:`TOLERANCES`)."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert set(got) == set(want)
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            tolerance = TOLERANCES.get(name, 0.0)
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=tolerance, msg=name)


@pytest.mark.parametrize("kind", MODELS)
def test_dynamo_finds_no_graph_break(kind):
    model, images, _ = _case(kind)
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(images)
    reasons = [reason.reason for reason in explanation.break_reasons]
    assert explanation.graph_break_count == 0, reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("kind", MODELS)
def test_compiled_model_detects_what_eager_detects(kind):
    model, images, expected = _case(kind)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        detections = compiled(images)
    assert int(detections[0]["num_detections"]) > 0  # NMS had work
    assert_same_padded_detections(expected, detections)


@pytest.mark.parametrize("kind", MODELS)
def test_exported_program_detects_what_eager_detects(kind):
    model, images, expected = _case(kind)
    with torch.no_grad():
        program = torch.export.export(model, (images,))
    targets = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert torch.ops.asickernels.select_detections.default in targets
    with torch.no_grad():
        detections = program.module()(images)
    assert_same_padded_detections(expected, detections)


def _selection_cases():
    generator = torch.Generator().manual_seed(3)
    corners = torch.rand(2, 12, 2, generator=generator) * 50
    boxes = torch.cat([corners, corners + torch.rand(2, 12, 2, generator=generator) * 20], -1)
    scores = torch.rand(2, 12, generator=generator)
    labels = torch.randint(0, 3, (2, 12), generator=generator, dtype=torch.int32)
    ops = torch.ops.asickernels
    return {
        "top_candidates": (ops.top_candidates, (scores,), {"k": 5, "score_threshold": 0.3}),
        "select_detections": (
            ops.select_detections,
            (boxes, scores, labels, scores > 0.2),
            {"iou_threshold": 0.5, "max_detections": 6, "min_size": 1.0, "backend": None},
        ),
    }


@pytest.mark.parametrize("name", list(_selection_cases()))
def test_selection_operators_pass_opcheck(name):
    """Schema, fake kernel (shapes and dtypes) and CPU kernel agree (torch's own check)."""
    operator, args, kwargs = _selection_cases()[name]
    torch.library.opcheck(operator, args, kwargs)
