"""The torch_xla SPMD wrappers on 4 CPU devices against the unsharded torch ops (run in its
own process by tests/frontends/test_spmd_torch_xla.py: SPMD mode and the device count are fixed when
the XLA runtime starts). Prints "ok" when every check passes."""

from __future__ import annotations

import os

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "4"

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from frontend_cases import SHARDED_OPS, every_argument

xr.use_spmd()

import asickernels.torch as at  # noqa: E402
from asickernels.frontends import torch_xla_spmd as spmd  # noqa: E402

BACKEND = "xla"


def check_every_argument(mesh: xs.Mesh, device: torch.device) -> None:
    """Each wrapper, given every argument with the arrays split 4 ways, returns what the
    unsharded torch function returns."""
    for op in SHARDED_OPS:
        values = {
            name: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for name, v in every_argument(op.name, batch=(4,)).items()
        }
        if op.partition == "matmul":
            values["out_dtype"] = torch.float32
            partition = {"m_axis": "data"}
        else:
            partition = {"batch_spec": (("data", "model"),)}
        on_xla = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in values.items()}
        got = getattr(spmd, op.name)(**on_xla, mesh=mesh, backend=BACKEND, **partition)
        want = getattr(at, op.name)(**values, backend=BACKEND)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert len(got) == len(want), op.name
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6, msg=op.name)


def boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    xy = rng.integers(0, 40, shape + (2,))
    return torch.from_numpy(
        np.concatenate([xy, xy + rng.integers(1, 16, shape + (2,))], -1).astype(np.float32)
    )


def main() -> None:
    assert xr.global_runtime_device_count() == 4
    mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "model"))
    device = torch_xla.device()
    rng = np.random.default_rng(0)
    preds, targets = boxes(rng, (8, 16)), boxes(rng, (8, 16))
    mask = torch.from_numpy(rng.uniform(size=(8, 16)) < 0.6)
    mask[:2] = False  # a whole shard of padding
    preds[~mask] = float("nan")

    got = spmd.giou(
        preds.to(device),
        targets.to(device),
        mesh=mesh,
        batch_spec=("data", "model"),
        backend=BACKEND,
    )
    assert torch.equal(got.cpu().nan_to_num(7.0), at.giou(preds, targets).nan_to_num(7.0))

    for reduction in ("none", "sum", "mean"):
        on_xla = preds.to(device).requires_grad_()
        loss = spmd.giou_loss(
            on_xla, targets.to(device), mesh=mesh, batch_spec=("data",), mask=mask.to(device),
            reduction=reduction, backend=BACKEND,
        )  # fmt: skip
        loss.sum().backward()
        on_cpu = preds.clone().requires_grad_()
        want = at.giou_loss(on_cpu, targets, mask=mask, reduction=reduction)
        want.sum().backward()
        torch.testing.assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(on_xla.grad.cpu(), on_cpu.grad, rtol=1e-5, atol=1e-7)
        assert torch.all(on_xla.grad.cpu()[~mask] == 0)

    # The same tensor, already sharded one way, used with another partitioning.
    sharded = preds.to(device)
    xs.mark_sharding(sharded, mesh, ("model", None, None))
    loss = spmd.giou_loss(
        sharded,
        targets.to(device),
        mesh=mesh,
        batch_spec=(("data", "model"),),
        mask=mask.to(device),
        backend=BACKEND,
    )
    torch.testing.assert_close(
        loss.cpu(), at.giou_loss(preds, targets, mask=mask), rtol=1e-5, atol=1e-6
    )

    scores = torch.from_numpy((rng.integers(0, 10, (4, 2, 64)) / 10).astype(np.float32))
    nms_boxes = boxes(rng, (4, 2, 64))
    categories = torch.from_numpy(rng.integers(0, 3, (4, 2, 64)))
    options = {"iou_threshold": 0.3, "max_output_size": 12, "backend": BACKEND}
    got = spmd.nms(
        nms_boxes.to(device), scores.to(device), mesh=mesh, batch_spec=("data", "model"), **options
    )
    want = at.nms(nms_boxes, scores, **options)
    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want, strict=True))
    got = spmd.batched_nms(
        nms_boxes.to(device), scores.to(device), categories.to(device), mesh=mesh,
        batch_spec=(("data", "model"),), **options,
    )  # fmt: skip
    want = at.batched_nms(nms_boxes, scores, categories, **options)
    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want, strict=True))

    x = torch.full((8, 2048), -128, dtype=torch.int8)
    x[4:] = torch.from_numpy(rng.integers(-128, 128, (4, 2048), dtype=np.int8))
    y = torch.full((2048, 6), -128, dtype=torch.int8)
    exact = x.long() @ y.long()
    for axes in (
        {"m_axis": "data", "n_axis": "model"},
        {"m_axis": "data", "k_axis": "model"},
        {"k_axis": ("data", "model")},
    ):
        got = spmd.int8_matmul(x.to(device), y.to(device), mesh=mesh, backend=BACKEND, **axes)
        assert got.dtype == torch.int32 and torch.equal(got.cpu().long(), exact), axes
    x_scale = torch.from_numpy(rng.uniform(0.01, 0.1, 8).astype(np.float32))
    y_scale = torch.tensor(0.5)
    for k_axis in (None, "model"):
        got = spmd.int8_matmul(
            x.to(device), y.to(device), mesh=mesh, m_axis="data", k_axis=k_axis,
            x_scale=x_scale.to(device), y_scale=y_scale.to(device), out_dtype=torch.bfloat16,
            backend=BACKEND,
        )  # fmt: skip
        want = at.int8_matmul(x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), want), k_axis

    check_every_argument(mesh, device)

    for call, message in (
        (
            lambda: spmd.giou(
                preds[:6].to(device),
                targets[:6].to(device),
                mesh=mesh,
                batch_spec=(("data", "model"),),
            ),
            "split evenly",
        ),
        (
            lambda: spmd.giou(
                preds[..., :3].to(device), targets[..., :3].to(device), mesh=mesh, batch_spec=()
            ),
            "[..., 4]",
        ),
    ):
        try:
            call()
        except ValueError as error:
            assert message in str(error), error
        else:
            raise AssertionError(f"expected a ValueError about {message!r}")
    print("ok")


if __name__ == "__main__":
    main()
