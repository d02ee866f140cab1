"""AWS-written kernels of the legacy ``neuronxcc.nki`` API (Neuron SDK 2.2x; the list in
../shared/corpus/README.md) and the seed article's NKI GIOU kernel, run unchanged through the
import hook (:func:`asickernels.simulate.nki.install.install`) and checked against numpy
(the files' own references where they have one), at small sizes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from conftest import DATA, REPO, SHARED, load_module
from mamba import mamba_inputs, selective_scan

from asickernels.kernels.giou import reference_giou
from asickernels.simulate.nki import install as hook
from asickernels.simulate.nki import last_counters

CORPUS = SHARED / "corpus" / "nki"
TUTORIALS = "src/nki_samples/tutorials"
SAMPLES = CORPUS / "nki-samples@6905a68" / TUTORIALS
NORMS = CORPUS / "nki-samples@7af4e4d" / TUTORIALS
SOFTMAX = CORPUS / "nki-samples@6dc4cb2" / TUTORIALS / "softmax" / "softmax_nki_kernels.py"
SEED_KERNEL = DATA / "seed_001_nki_giou.txt"

needs_corpus = pytest.mark.skipif(
    not CORPUS.is_dir(), reason=f"vendor kernel corpus not found at {CORPUS}"
)
RNG = np.random.default_rng(0)


@pytest.fixture
def load() -> Iterator[Any]:
    """``load(path)``: imports the corpus file with the hook installed (``neuronxcc.nki``
    resolving to the simulator); the hook, modules, sys.path and environment are restored."""
    if hook.real_sdk_available("neuronxcc"):
        pytest.skip("a real neuronxcc is installed: the hook does not shadow it")
    hook.install()
    saved_env, saved_path = dict(os.environ), list(sys.path)
    loaded: list[str] = []

    def load_file(path: Path) -> ModuleType:
        sys.path.insert(0, str(path.parent))
        name = f"legacy_corpus_{path.stem}"
        loaded.append(name)
        return load_module(path, name)

    try:
        yield load_file
    finally:
        hook.uninstall()
        for name in loaded:
            sys.modules.pop(name, None)
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)


@needs_corpus
def test_tensor_addition_spmd_grid(load):
    module = load(SAMPLES / "tensor_addition" / "tensor_addition_nki_kernels.py")
    a = RNG.random((256, 1024)).astype(np.float16)
    b = RNG.random((256, 1024)).astype(np.float16)
    out = module.nki_tensor_add(a, b)  # a [2, 2] launch grid
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, a + b, atol=1e-4, rtol=1e-2)  # the file's tolerance
    assert last_counters()["dma_transfers"] == 4 * 3  # 4 programs: 2 loads + 1 store each


@needs_corpus
def test_transpose2d_index_grids(load):
    module = load(SAMPLES / "transpose2d" / "transpose2d_nki_kernels.py")
    p, x, y = 5, 3, 4
    a = np.arange(p * x * y, dtype=np.int8).reshape(p, x * y)
    expected = np.transpose(a.reshape(p, x, y), (0, 2, 1)).reshape(p, x * y)
    np.testing.assert_array_equal(module.tensor_transpose2D_kernel_(a, (x, y)), expected)


@needs_corpus
def test_average_pool2d_mgrid(load):
    module = load(SAMPLES / "average_pool2d" / "average_pool2d_nki_kernels.py")
    image = np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6)
    out = module.tensor_avgpool_kernel(image, 2)
    np.testing.assert_array_equal(out, module.np_average_pool_2D(image, 2))  # exact, as there


@needs_corpus
@pytest.mark.parametrize("version", ["mamba_v1", "mamba_v2", "mamba_v3"])
def test_fused_mamba(load, version):
    module = load(SAMPLES / "fused_mamba" / "mamba_nki_kernels.py")
    inputs = mamba_inputs(RNG, (0.01, 0.1), (0.5, 2.0))  # seq_len 1024: v3 tiles it by 512
    out = getattr(module, version)(*inputs)
    np.testing.assert_allclose(out, selective_scan(*inputs), rtol=1e-4, atol=1e-4)


def _attention(q, k, v):
    scores = q.T.astype(np.float64) @ k
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (scores / scores.sum(axis=1, keepdims=True)) @ v.T


ATTENTION = [
    # (kernel, seqlen, absolute tolerance): v7 and later keep exp/scores in bfloat16
    ("attn_fwd_v1", 128, 1e-4),
    ("attn_fwd_v2", 128, 1e-4),
    ("attn_fwd_v3", 512, 1e-4),
    pytest.param("attn_fwd_v4", 512, 1e-4, marks=pytest.mark.slow),
    pytest.param("attn_fwd_v5", 512, 1e-4, marks=pytest.mark.slow),
    pytest.param("attn_fwd_v6", 512, 1e-4, marks=pytest.mark.slow),
    pytest.param("attn_fwd_v7", 512, 3e-2, marks=pytest.mark.slow),
    pytest.param("attn_fwd_v8", 512, 3e-2, marks=pytest.mark.slow),
    ("attn_fwd_v8a", 512, 3e-2),
    pytest.param("attn_fwd_v11", 512, 3e-2, marks=pytest.mark.slow),
]


@needs_corpus
@pytest.mark.parametrize(("kernel", "seqlen", "atol"), ATTENTION)
def test_attention_forward(load, kernel, seqlen, atol):
    module = load(SAMPLES / "attention_fwd_performance" / "attention_kernels.py")
    q, k, v = (RNG.standard_normal((128, seqlen)).astype(np.float32) for _ in range(3))
    out = getattr(module, kernel)(q, k, v)
    np.testing.assert_allclose(np.asarray(out, np.float32), _attention(q, k, v), atol=atol)


@needs_corpus
@pytest.mark.parametrize("kernel", ["attn_fwd_v9", "attn_fwd_v10"])
def test_attention_with_direct_allocation(load, kernel):
    """v9/v10 place their tensors at explicit SBUF and PSUM addresses
    (``nki.compiler.sbuf.mod_alloc``, PSUM banks shared between tensors)."""
    module = load(SAMPLES / "attention_fwd_performance" / "attention_kernels.py")
    q, k, v = (RNG.standard_normal((128, 512)).astype(np.float32) for _ in range(3))
    out = getattr(module, kernel)(q, k, v)
    np.testing.assert_allclose(np.asarray(out, np.float32), _attention(q, k, v), atol=3e-2)


@needs_corpus
def test_rmsnorm_masks_partial_tiles(load):
    module = load(NORMS / "rmsnorm" / "rmsnorm_nki_kernels.py")
    a = RNG.random((300, 512)).astype(np.float32)  # 300 rows: the last tile is masked
    g = RNG.random(512).astype(np.float32)
    expected = a * (1.0 / np.sqrt(np.mean(a * a, axis=1).reshape(a.shape[0], 1))) * g
    np.testing.assert_allclose(module.nki_rmsnorm_kernel(a, g), expected, atol=1e-4, rtol=1e-2)


def _layernorm(x, eps, gamma, beta):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + eps) * gamma + beta


@needs_corpus
@pytest.mark.parametrize(
    ("version", "cols"),
    # v2's bn_stats runs on 512-column chunks; the SDK does not mask bn_stats' reduction
    # dimension (general/nki/nki_known_issues.rst), so its widths are multiples of 512.
    [("nki_layernorm_kernel_v1", 1000), ("nki_layernorm_kernel_v2", 1024)],
)
def test_layernorm(load, version, cols):
    module = load(NORMS / "layernorm" / "layernorm_nki_kernel.py")
    x = RNG.random((300, cols)).astype(np.float32)
    gamma = RNG.random(cols).astype(np.float32)
    beta = RNG.random(cols).astype(np.float32)
    out = getattr(module, version)(x, 1e-5, gamma, beta)
    np.testing.assert_allclose(out, _layernorm(x, 1e-5, gamma, beta), atol=1e-4, rtol=1e-3)


SOFTMAX_CHECK = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import softmax_nki_kernels as module
x = np.random.default_rng(0).standard_normal((300, 256)).astype(np.float32)
e = np.exp(x - x.max(axis=1, keepdims=True))
np.testing.assert_allclose(module.nki_softmax_kernel(x), e / e.sum(axis=1, keepdims=True),
                           rtol=1e-5, atol=1e-6)
print("softmax matches")
"""


@needs_corpus
@pytest.mark.slow  # ~20 s: the subprocess imports torch_xla
def test_softmax(tmp_path):
    """The softmax file imports ``torch_xla.core.xla_model`` at module level, so it runs
    where torch_xla is installed: this interpreter, or the project's torch_xla venv."""
    python = sys.executable
    if importlib.util.find_spec("torch_xla") is None:
        python = str(REPO / ".venv-torch-xla" / "bin" / "python")
        if not Path(python).exists():
            pytest.skip("softmax_nki_kernels.py imports torch_xla, installed nowhere here")
    script = tmp_path / "check_softmax.py"
    script.write_text(SOFTMAX_CHECK)
    result = subprocess.run(
        [python, "-m", "asickernels.simulate.nki", str(script), str(SOFTMAX.parent)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "softmax matches" in result.stdout


def _seed_program() -> str:
    """The seed article's GIOU program (indentation restored). Without torch (the main
    environment has none) its four torch lines go: they only convert the inputs for the
    device branch, which a machine without torch_xla never takes."""
    source = SEED_KERNEL.read_text()
    if importlib.util.find_spec("torch") is not None:
        return source
    lines = source.splitlines()
    kept = [line for line in lines if line != "import torch" and "torch.tensor(" not in line]
    assert len(lines) - len(kept) == 4
    return "\n".join(kept)


def test_seed_giou_kernel_through_its_own_simulate_kernel(monkeypatch, capsys):
    """The seed's kernel runs through its own ``nki.simulate_kernel`` call (1024 x 256 box
    pairs, written into its output argument ``out``) and matches the float64 reference."""
    if hook.real_sdk_available("neuronxcc"):
        pytest.skip("a real neuronxcc is installed: the hook does not shadow it")
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # the seed's CPU branch
    hook.install()
    namespace: dict[str, Any] = {"__name__": "seed_001_nki_giou"}
    try:
        exec(compile(_seed_program(), str(SEED_KERNEL), "exec"), namespace)
    finally:
        hook.uninstall()
    assert namespace["simulate"] is True
    boxes1, boxes2 = namespace["boxes"]
    expected = reference_giou(boxes1, boxes2)
    # float32 arithmetic on integer coordinates up to 255: areas are exact, the two
    # divisions round once each.
    np.testing.assert_allclose(namespace["out"], expected, rtol=2e-6, atol=2e-6)
    assert "preds" in capsys.readouterr().out  # its nl.device_print debugging output
