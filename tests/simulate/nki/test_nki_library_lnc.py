"""AWS's nki-library@d2ad3a5 kernels that use collectives, ``sendrecv`` or LNC=2 sharding,
run unchanged (through the import hook) on their real number of ranks and cores, against
numpy goldens that follow each kernel's own test file (same parameters, tolerances).

The library's simulation harness (test/utils/simulation_setup.py) launches one rank and
takes a dict of inputs, so its collective tests (per-rank inputs and goldens) do not run in
its own simulation mode; here ``nki.multi_rank_simulate`` runs them. The kernels of
test_collectives.py live in that test file, beside a harness that needs AWS's test
infrastructure: they are taken from it (its ``@nki.jit`` functions and their imports only).
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import SHARED, VENDOR

from asickernels.simulate.nki import errors
from asickernels.simulate.nki import install as hook

LIBRARY = next(
    (p for p in (VENDOR / "nki-library@d2ad3a5", SHARED / "vendor" / "nki-library@d2ad3a5")
     if p.is_dir()),
    None,
)  # fmt: skip
pytestmark = pytest.mark.skipif(
    LIBRARY is None, reason="nki-library@d2ad3a5 is absent from the vendor directory"
)


@pytest.fixture
def nkilib(monkeypatch) -> Iterator[Any]:
    """``nkilib(module)``: imports a module of the library (``nkilib_src.nkilib...``) with the
    hook installed; the target is trn2, the library's platform. Modules, path and hook are
    restored afterwards."""
    if hook.real_sdk_available("nki"):
        pytest.skip("a real nki is installed: the hook does not shadow it")
    assert LIBRARY is not None
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    hook.install()
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(LIBRARY / "src"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.DeprecatedApiWarning)  # nki.isa.sendrecv (0.8)
            yield importlib.import_module
    finally:
        hook.uninstall()
        for name in set(sys.modules) - saved_modules:
            if name.startswith("nkilib_src"):
                del sys.modules[name]
        sys.path[:] = saved_path


def file_definitions(nkilib, relative: str, names: list[str]) -> dict[str, Any]:
    """The module-level definitions ``names`` of the test file ``relative`` (under test/),
    run with the file's imports except its test harness (``test.utils``)."""
    nkilib("nki")  # the hooked package, before the file's own imports
    assert LIBRARY is not None
    path = LIBRARY / "test" / relative
    tree = ast.parse(path.read_text())
    kept = [
        node
        for node in tree.body
        if (isinstance(node, ast.Import | ast.ImportFrom) and not _imports_harness(node))
        or getattr(node, "name", None) in names
    ]
    namespace: dict[str, Any] = {"__name__": f"vendor_{Path(relative).stem}"}
    exec(compile(ast.Module(kept, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def _imports_harness(node: ast.Import | ast.ImportFrom) -> bool:
    modules = (
        [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
    )
    return any(m.startswith("test.") for m in modules)


def ranks(nki: Any, kernel: Any, inputs: list[dict[str, Any]]) -> list[Any]:
    return nki.multi_rank_simulate(
        kernel, world_size=len(inputs), per_rank_inputs=[((), kw) for kw in inputs]
    )


# -- experimental/collectives/test_collectives.py ------------------------------------------
COLLECTIVES_TEST = "integration/nkilib/experimental/collectives/test_collectives.py"


@pytest.mark.parametrize(("collective_ranks", "lnc"), [(2, 2), (2, 1)])
def test_all_reduce_all_gather_reduce_scatter_hbm_kernels(nkilib, collective_ranks, lnc):
    """test_all_reduce / test_all_gather / test_reduce_scatter's parameters and goldens."""
    nki = nkilib("nki")
    ncc = nkilib("nki.collectives")
    kernels = file_definitions(
        nkilib,
        COLLECTIVES_TEST,
        ["all_reduce_hbm_kernel", "all_gather_hbm_kernel", "reduce_scatter_hbm_kernel"],
    )
    group = ncc.ReplicaGroup([list(range(collective_ranks))])
    np.random.seed(42)
    x_in = np.random.randn(128, 512).astype(np.float32)
    outs = ranks(nki, kernels["all_reduce_hbm_kernel"][lnc],
                 [{"input": x_in, "replica_group": group}] * collective_ranks)  # fmt: skip
    for out in outs:
        np.testing.assert_allclose(out, x_in * collective_ranks, rtol=1e-3, atol=1e-3)

    x_global = np.random.randn(collective_ranks, 128, 512).astype(np.float32)
    inputs = [
        {"input": x_global[r], "replica_group": group, "num_ranks": collective_ranks}
        for r in range(collective_ranks)
    ]
    for out in ranks(nki, kernels["all_gather_hbm_kernel"][lnc], inputs):
        np.testing.assert_allclose(out, x_global.reshape(-1, 512), rtol=1e-3, atol=1e-3)

    H = 128 * collective_ranks
    x_global = np.random.randn(collective_ranks, H, 512).astype(np.float32)
    inputs = [
        {"input": x_global[r], "replica_group": group, "num_ranks": collective_ranks}
        for r in range(collective_ranks)
    ]
    summed = x_global.sum(axis=0)
    for r, out in enumerate(ranks(nki, kernels["reduce_scatter_hbm_kernel"][lnc], inputs)):
        np.testing.assert_allclose(out, summed[r * 128 : (r + 1) * 128], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("collective_ranks", "lnc"), [(4, 2), (8, 1)])
def test_all_to_all_hbm_kernel(nkilib, collective_ranks, lnc):
    nki = nkilib("nki")
    ncc = nkilib("nki.collectives")
    kernel = file_definitions(nkilib, COLLECTIVES_TEST, ["all_to_all_hbm_kernel"])
    np.random.seed(42)
    H = 128 * collective_ranks
    x_in = np.random.randn(H, 512).astype(np.float32)
    group = ncc.ReplicaGroup([list(range(collective_ranks))])
    inputs = [{"input": x_in, "replica_group": group}] * collective_ranks
    outs = ranks(nki, kernel["all_to_all_hbm_kernel"][lnc], inputs)
    # The file's golden, np.tile(x_in[:128], (ranks, 1)), is rank 0's (the one rank its
    # harness checks); rank r gets chunk r from every rank (the kernel's docstring).
    for r, out in enumerate(outs):
        golden = np.tile(x_in[r * 128 : (r + 1) * 128], (collective_ranks, 1))
        np.testing.assert_allclose(out, golden, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("collective_ranks", "lnc"), [(2, 2), (2, 1)])
def test_rank_id_kernels(nkilib, collective_ranks, lnc):
    """rank_id as a DMA's scalar_offset, directly and through an SBUF lookup table."""
    nki = nkilib("nki")
    kernels = file_definitions(
        nkilib, COLLECTIVES_TEST, ["rank_id_kernel", "dma_copy_rank_id_kernel"]
    )
    np.random.seed(42)
    in_tensor = np.random.randn(collective_ranks, 128, 512).astype(np.float32)
    for r, out in enumerate(
        ranks(nki, kernels["rank_id_kernel"][lnc], [{"in_tensor": in_tensor}] * collective_ranks)
    ):
        np.testing.assert_array_equal(out, in_tensor[r])
    in_tensor = np.random.randn(collective_ranks, 128, 64).astype(np.float32)
    lookup = np.arange(collective_ranks, dtype=np.int32).reshape(1, collective_ranks)
    inputs = [{"in_tensor": in_tensor, "rank_id_lookup": lookup}] * collective_ranks
    for r, out in enumerate(ranks(nki, kernels["dma_copy_rank_id_kernel"][lnc], inputs)):
        np.testing.assert_array_equal(out, in_tensor[r])


@pytest.mark.parametrize("layout", ["NBSd", "dBnS"])
@pytest.mark.parametrize("use_input_rank", [False, True])
def test_attn_q_batch_shard(nkilib, layout, use_input_rank):
    """TP4 -> TP2DP2 (test_batch_shard_input's one enabled case): all_gather over rank-lists
    [[0, 1], [2, 3]], then each rank's batch slice picked by its rank_id."""
    nki = nkilib("nki")
    ncc = nkilib("nki.collectives")
    found = file_definitions(
        nkilib, COLLECTIVES_TEST, ["attn_q_batch_shard", "AttnQBatchShardLayout"]
    )
    collective_ranks, lnc, gqa, q_heads, batch = 4, 2, 2, 1, 8
    s_tkg, d_head, per_rank = 1, 64, batch // gqa
    group = ncc.ReplicaGroup(
        [[i * gqa + j for j in range(gqa)] for i in range(collective_ranks // gqa)]
    )
    is_nbsd = layout == "NBSd"
    np.random.seed(42)
    shape = (
        (collective_ranks, batch, s_tkg, d_head)
        if is_nbsd
        else (collective_ranks, d_head, batch, s_tkg)
    )
    q_global = np.random.randn(*shape).astype(np.float32)
    buf_shape = (
        (gqa, q_heads, batch, s_tkg, d_head) if is_nbsd else (gqa, d_head, batch, q_heads, s_tkg)
    )
    inputs = []
    for r in range(collective_ranks):
        x_in = (
            q_global[r : r + 1]
            if is_nbsd
            else q_global[r : r + 1].reshape(d_head, batch, q_heads, s_tkg)
        )
        kwargs = {
            "input": x_in,
            "iota_workers": np.array(
                [(w % gqa) * per_rank for w in range(collective_ranks)], np.int32
            ).reshape(1, collective_ranks),
            "gathered_buf": np.zeros(buf_shape, np.float32),
            "gqa_group_size": gqa,
            "replica_group": group,
            "layout": getattr(found["AttnQBatchShardLayout"], layout),
        }
        if use_input_rank:
            kwargs["rank_id_in"] = np.array([[r]], np.int32)
        inputs.append(kwargs)
    outs = ranks(nki, found["attn_q_batch_shard"][lnc], inputs)
    for r, out in enumerate(outs):
        g, k = r // gqa, r % gqa
        heads, rows = slice(g * gqa, (g + 1) * gqa), slice(k * per_rank, (k + 1) * per_rank)
        golden = q_global[heads, rows] if is_nbsd else q_global[heads, :, rows]
        np.testing.assert_array_equal(out, golden)


# -- experimental/collectives kernels ---------------------------------------------------------
@pytest.mark.parametrize(
    ("m", "k", "dtype", "tp"),
    [
        (128, 512, ml_dtypes.bfloat16, 8),
        (96, 512, ml_dtypes.bfloat16, 16),
        (64, 1024, np.float16, 8),
    ],
)
def test_allgather_sb2sb(nkilib, m, k, dtype, tp):
    """test_sb2sb_allgather.py's first cases: an all_gather of SBUF tiles along the free axis."""
    nki = nkilib("nki")
    ncc = nkilib("nki.collectives")
    module = nkilib("nkilib_src.nkilib.experimental.collectives.sb2sb_allgather")
    np.random.seed(42)
    x = np.random.randn(tp, m, k).astype(dtype)
    group = ncc.ReplicaGroup([list(range(tp))])
    inputs = [{"inp": x[r], "replica_groups": group, "tp_degree": tp} for r in range(tp)]
    gathered = np.concatenate(list(x), axis=1)
    for out in ranks(nki, module.allgather_sb2sb, inputs):
        np.testing.assert_array_equal(out, gathered)


@pytest.mark.parametrize(
    ("m", "k", "tp", "lnc"),
    [(128, 512, 4, 2), (256, 512, 8, 1), (256, 512, 4, 2), (512, 1024, 8, 2)],
)
def test_allgather_sb2sb_tiled(nkilib, m, k, tp, lnc):
    """test_allgather_sb2sb_tiled's cases: at LNC=2 each core gathers its own row tiles."""
    nki = nkilib("nki")
    ncc = nkilib("nki.collectives")
    module = nkilib("nkilib_src.nkilib.experimental.collectives.sb2sb_allgather")
    np.random.seed(42)
    x = np.random.randn(tp, m, k).astype(ml_dtypes.bfloat16)
    group = ncc.ReplicaGroup([list(range(tp))])
    inputs = [{"inp": x[r], "replica_groups": group, "tp_degree": tp} for r in range(tp)]
    gathered = np.concatenate(list(x), axis=1)
    for out in ranks(nki, module.allgather_sb2sb_tiled[lnc], inputs):
        np.testing.assert_array_equal(out, gathered)


@pytest.mark.parametrize(
    ("tp", "lnc", "force_hbm_cc"),
    [(4, 2, False), (8, 2, False), (4, 1, False), (4, 1, True), (8, 1, True)],
)
def test_fine_grained_allgather(nkilib, tp, lnc, force_hbm_cc):
    """fine_grained_allgather (a ring of collective_permute_implicit steps, two channels at
    LNC=2, the rank of each chunk from collective_permute_implicit_current_processing_rank_id)
    at smaller sizes than test_fg_allgather.py's one case (1024 x 4096 bf16, tp4, LNC=2). Its
    HBM path runs at LNC=1 only: at LNC=2 both cores of a rank permute the same shared HBM
    double buffers with nothing ordering one core's reads against the other's next permute
    (the file disables its LNC=2 HBM cases, NKILIB-795)."""
    nki = nkilib("nki")
    module = nkilib("nkilib_src.nkilib.experimental.collectives.fg_allgather")
    m, K = 64, 256
    np.random.seed(42)
    lhs = np.random.randn(m * tp, K).astype(ml_dtypes.bfloat16)
    inputs = [
        {
            "lhs": lhs[r * m : (r + 1) * m],
            "tp_degree": tp,
            "num_groups": 1,
            "force_hbm_cc": force_hbm_cc,
        }
        for r in range(tp)
    ]
    for out in ranks(nki, module.fine_grained_allgather[lnc], inputs):
        np.testing.assert_array_equal(out.reshape(m * tp, K), lhs)


def test_allgather_compute_matmul(nkilib):
    """fgcc's fused all-gather + matmul at LNC=2 on 4 ranks (test_fgcc.py's case, smaller):
    each rank's column shard of lhs_global @ rhs_global, within the file's 1e-2 tolerances."""
    nki = nkilib("nki")
    module = nkilib("nkilib_src.nkilib.experimental.collectives.fgcc")
    m, K, N, tp = 64, 256, 512, 4
    np.random.seed(42)
    lhs = np.random.randn(m * tp, K).astype(ml_dtypes.bfloat16)
    rhs = np.random.randn(K, N).astype(ml_dtypes.bfloat16)
    golden = (lhs.astype(np.float32) @ rhs.astype(np.float32)).astype(ml_dtypes.bfloat16)
    cols = N // tp
    inputs = [
        {"lhs": lhs[r * m : (r + 1) * m], "rhs": rhs[:, r * cols : (r + 1) * cols],
         "tp_degree": tp, "num_groups": 1}
        for r in range(tp)
    ]  # fmt: skip
    for r, out in enumerate(ranks(nki, module.allgather_compute_matmul[2], inputs)):
        np.testing.assert_allclose(
            out.reshape(m * tp, cols).astype(np.float32),
            golden[:, r * cols : (r + 1) * cols].astype(np.float32),
            rtol=1e-2,
            atol=1e-2,
        )


# -- LNC=2 core kernels ------------------------------------------------------------------
def rmsnorm_golden(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """rmsnorm_tkg's LNC=2 output layout (its docstring's pseudocode): the normalized rows'
    two hidden halves, each as [128, BxS, H/256], side by side."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    normed = rows / np.sqrt((rows**2).mean(axis=1, keepdims=True) + eps) * gamma.astype(np.float32)
    halves = np.split(normed, 2, axis=1)
    return np.concatenate(
        [h.reshape(len(rows), 128, -1).transpose(1, 0, 2) for h in halves], axis=2
    )


@pytest.mark.parametrize(
    ("batch", "seqlen", "hidden", "shard_on_h"),
    [
        (1, 1, 5120, False),
        (2, 8, 8192, False),
        (4, 8, 8192, False),
        (2, 8, 8192, True),
        (1, 1, 5120, True),
    ],
)
def test_rmsnorm_tkg_at_lnc2(nkilib, batch, seqlen, hidden, shard_on_h):
    """test_rmsnorm_tkg.py's LNC=2 cases (fp16, rtol 2e-2): the two cores split the rows, or
    (shard_on_h) the hidden dimension and exchange their partial sums with nisa.sendrecv."""
    nki = nkilib("nki")
    module = nkilib("nkilib_src.nkilib.core.subkernels.rmsnorm_tkg")
    np.random.seed(42)
    x = np.random.randn(batch, seqlen, hidden).astype(np.float16)
    gamma = np.random.randn(1, hidden).astype(np.float16)
    out = np.zeros((128, batch * seqlen, hidden // 128), np.float16)
    result = nki.jit(module.rmsnorm_tkg)[2](x, gamma, out, shard_on_h=shard_on_h)
    np.testing.assert_allclose(
        result.astype(np.float32), rmsnorm_golden(x, gamma), rtol=2e-2, atol=1e-5
    )


@pytest.mark.parametrize(
    ("batch", "seqlen", "positions_per_batch"), [(1, 1, 1), (3, 1, 1), (1, 5, 2)]
)
def test_cross_entropy_forward_and_backward_at_lnc2(nkilib, batch, seqlen, positions_per_batch):
    """The loss tests' smallest case (B=T=1: one row for two cores, core 0 gets an empty row
    range) and uneven splits, bf16, at the files' 1e-2 tolerances."""
    nl = nkilib("nki.language")
    module = nkilib("nkilib_src.nkilib.experimental.loss.cross_entropy")
    vocab = 512
    np.random.seed(42)
    logits = np.random.randn(batch * seqlen, vocab).astype(ml_dtypes.bfloat16)
    targets = np.random.randint(0, vocab, size=(batch * seqlen,), dtype=np.int32)
    wide = logits.astype(np.float64)
    lse = np.log(np.exp(wide).sum(axis=1))
    loss = lse - wide[np.arange(len(targets)), targets]
    got_loss, got_lse = module.cross_entropy_forward[2](
        logits,
        targets,
        positions_per_batch=positions_per_batch,
        chunk_size=vocab,
        dtype=nl.bfloat16,
    )
    np.testing.assert_allclose(got_loss.astype(np.float64), loss, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got_lse.astype(np.float64), lse, rtol=1e-2, atol=1e-2)

    grad = module.cross_entropy_backward[2](
        logits, targets, lse.astype(ml_dtypes.bfloat16), reduction="mean",
        positions_per_batch=positions_per_batch, chunk_size=vocab, dtype=nl.bfloat16,
    )  # fmt: skip
    softmax = np.exp(wide - lse[:, None])
    softmax[np.arange(len(targets)), targets] -= 1
    np.testing.assert_allclose(
        grad.astype(np.float64), softmax / len(targets), rtol=1e-2, atol=1e-2
    )
