"""One training step of RetinaNet and Faster R-CNN made
:func:`asickernels.torch.detection.xla_ready`, on the torch_xla CPU device: the losses and
every parameter's gradient (through asickernels' ``roi_align`` backward for Faster R-CNN)
against CPU torchvision's on the same weights and data. Training runs torchvision's own
loss code, whose boolean indexing falls back to the CPU; the fallbacks are counted, and
none is an RoI pooling. Runs in the torch_xla environment."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
torch_xla = pytest.importorskip("torch_xla")
metrics = pytest.importorskip("torch_xla.debug.metrics")

from asickernels.testing import detection_models  # noqa: E402
from asickernels.torch import detection  # noqa: E402

# XLA's convolutions sum in another order than CPU torch's; measured: losses within 1e-7
# relative, gradients within 2e-6 of each tensor's largest |gradient|.
LOSS_RTOL = 1e-5
GRADIENT_TOL = 1e-4  # relative to the tensor's largest |gradient|


def _targets():
    return [
        {"boxes": torch.tensor([[10.0, 12.0, 90.0, 100.0]]), "labels": torch.tensor([1])},
        {
            "boxes": torch.tensor([[30.0, 5.0, 70.0, 150.0], [5.0, 50.0, 60.0, 90.0]]),
            "labels": torch.tensor([3, 2]),
        },
    ]


def _model(kind):
    model = detection_models.model(kind).train()
    if kind == "faster_rcnn":
        # Sample every anchor and every proposal: the samplers' random draws differ
        # between the CPU and the XLA device, the full sets do not.
        model.rpn.fg_bg_sampler.batch_size_per_image = 10**6
        model.roi_heads.fg_bg_sampler.batch_size_per_image = 10**6
        model.rpn._pre_nms_top_n["training"] = 200  # (2000 by default: a smaller graph)
        model.rpn._post_nms_top_n["training"] = 100
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["retinanet", "faster_rcnn"])
def test_training_step_matches_cpu_torchvision(kind):
    model = _model(kind)
    device = torch_xla.device()
    ready = detection.xla_ready(copy.deepcopy(model)).to(device)
    images, targets = detection_models.images(), _targets()
    want = model(images, targets)
    sum(want.values()).backward()
    metrics.clear_all()
    got = ready(
        [image.to(device) for image in images],
        [{k: v.to(device) for k, v in target.items()} for target in targets],
    )
    sum(got.values()).backward()
    torch_xla.sync()
    fallbacks = {n for n in metrics.counter_names() if "::" in n and not n.startswith("xla::")}
    assert not any("roi_align" in name for name in fallbacks), fallbacks
    assert set(got) == set(want)
    for name, loss in want.items():
        torch.testing.assert_close(got[name].cpu(), loss, rtol=LOSS_RTOL, atol=0.0)
    for (name, expected), actual in zip(model.named_parameters(), ready.parameters(), strict=True):
        if expected.grad is None:
            assert actual.grad is None, name
            continue
        scale = float(expected.grad.abs().max())
        difference = float((actual.grad.cpu() - expected.grad).abs().max())
        assert difference <= GRADIENT_TOL * scale + 1e-12, (name, difference, scale)
