"""The nki-samples CI latency thresholds against the cost model: upper bounds, not figures.

    PYTHONPATH=. python benchmarks/nki_estimate/nki_samples.py NKI_SAMPLES [--traces DIR]
        [--budget-min 10] [--readme]

NKI_SAMPLES is github.com/aws-neuron/nki-samples: the git directory the search tool's
``fetch`` brings, or a clone. Until fc5c69f ("Remove all perf checks in preparation for
beta-2 update"), each ``test/unit/test_*.py`` had a ``*_perf`` test that benchmarked a
reference kernel with ``nki.benchmark`` and asserted ``get_latency_percentile(P) <=
threshold``; this script reads those tests at fc5c69f^ (COMMIT) with ``ast`` (parameters,
percentile, the asserted right-hand side, evaluated per case) and the kernels of the same
commit's ``src/`` (written to a temporary directory and imported; never committed), runs each
kernel unchanged through ``nki.benchmark`` in trace-only mode on ``nt.tensor`` placeholders of
the test's shapes and dtypes, and estimates the trace.

What a threshold is: the test passed when the device's percentile was at or below it, so the
device ran at least that fast (if the test passed); how much faster it cannot say. An
estimate above its threshold over-estimates the device; one far below it says little.

The unit: ``get_latency_percentile`` "returns the specified percentile latency in
microsecond(us)" (aws-neuron-sdk@72825d5 general/nki/api/nki/__init__.py, ``benchmark``).
The device: not stated for the thresholds. The repository's CI workflow
(.github/workflows/run_simulation_tests.yml@COMMIT) runs only ``--simulation-only`` on
ubuntu-latest, so the perf tests ran elsewhere; the history shows trn1 among their targets
(``@xfail(fail=['trn1'])``, removed by 97d5adb "test_double_row_matmul.py shouldn't run on
trn1/inf2"), and ``test_double_row_matmul_perf`` returns early unless the instance is trn2.
So every case is estimated on NeuronCore-v2 (trn1/inf2) except double_row_matmul's, on v3.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import itertools
import json
import math
import pathlib
import pickle
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from asickernels.simulate.nki import runtime
from asickernels.simulate.nki.estimate import estimate
from asickernels.simulate.nki.install import install

HERE = pathlib.Path(__file__).resolve().parent
# this folder's scripts share nkibench's helpers; the folder leaves sys.path again, as its
# nki_samples.py would shadow the vendor package of that name for whoever imports this
sys.path.insert(0, str(HERE))
try:
    from nkibench import PinnedRepo, keep_trace, write_section
finally:
    sys.path.remove(str(HERE))

KERNELS = "src/nki_samples/reference"
REPO = "aws-neuron/nki-samples"
COMMIT = "0898a77"  # fc5c69f^: the last commit with the perf checks
UNIT_SOURCE = "aws-neuron-sdk@72825d5 general/nki/api/nki/__init__.py (benchmark)"
# A threshold this large bounds nothing: 100 s, where every kernel here takes milliseconds.
VACUOUS_US = 1e8
# Flash attention at 32K tokens simulates for hours: such a case is first traced at
# PROBE_SEQLEN tokens and its time extrapolated (in proportion to query x key length).
PROBE_SEQLEN = 4096


def _placeholder(shape: tuple[int, ...], dtype: Any) -> Any:
    import neuronxcc.nki.typing as nt  # type: ignore[import-not-found]

    return nt.tensor[list(shape), dtype]


# Per test file: the kernel's module and name, and how the test calls it from its parameters
# ``p`` (placeholders in place of the test's random arrays): (grid, args, kwargs). ``module`` is
# the imported kernel module (flash_fwd's FlashConfig lives there).
Call = tuple[tuple[int, ...], tuple[Any, ...], dict[str, Any]]


def _sd_attention(p: dict, module: Any) -> Call:
    bs, d, s, t = p["bs"], p["d"], p["seqlen"], p["dtype"]
    qkv = [(bs, d, s), (bs, s, d), (bs, s, d)]
    return (bs,), tuple(_placeholder(shape, t) for shape in qkv), {}


def _allocated_sd_attention(p: dict, module: Any) -> Call:
    bs, d, s, t = p["bs"], p["d"], p["seqlen"], p["dtype"]
    qkv = [(bs, d, s), (bs, d, s), (bs, s, d)]
    return (bs,), tuple(_placeholder(shape, t) for shape in qkv), {}


def _adaptive_avg_pool2d(p: dict, module: Any) -> Call:
    shape = (p["N"], p["C"], p["H"], p["W"])
    return (), (_placeholder(shape, p["dtype"]), p["output_size"]), {}


def _double_row_matmul(p: dict, module: Any) -> Call:
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]

    m, k, n, t = p["M"], p["K"], p["N"], p["dtype"]
    args = (
        _placeholder((m, k), t),
        _placeholder((k // 2, 2 * n), nl.float8_e4m3),  # the test's reshape(rhs_quantized)
        _placeholder((128, n), t),
        p["TILES_IN_BLOCK_M"],
        p["TILES_IN_BLOCK_N"],
        p["TILES_IN_BLOCK_K"],
    )
    return (), args, {}


def _flash_attn_bwd(p: dict, module: Any) -> Call:
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]

    bs, h, d, s, t = p["bs"], p["nheads"], p["d"], p["seqlen"], p["dtype"]
    q, k, v, o_proj, dy = (_placeholder((bs, h, d, s), t) for _ in range(5))
    lse = _placeholder((bs, h, 128, s // 128), nl.float32)
    sinks = _placeholder((bs, h), t) if p["sinks"] else None
    kwargs = {"use_causal_mask": True, "mixed_precision": True, "sinks": sinks}
    return (bs, h), (q, k, v, o_proj, dy, lse, None), kwargs


def _flash_attn_fwd(p: dict, module: Any) -> Call:
    bs, h, d, t = p["bs"], p["nheads"], p["d"], p["dtype"]
    sq, sk = p["seqlen_q"], p["seqlen_k"]
    v_shape = (bs, h, d, sk) if p["should_transpose_v"] else (bs, h, sk, d)
    args = (
        _placeholder((bs, h, d, sq), t),
        _placeholder((bs, h, d, sk), t),
        _placeholder(v_shape, t),
        None,
    )
    config = module.FlashConfig(
        seq_tile_size=p["tile_size"],
        training=p["training"],
        should_transpose_v=p["should_transpose_v"],
    )
    kwargs = {
        "use_causal_mask": p["use_causal_mask"],
        "sliding_window": p["sliding_window"],
        "mixed_precision": p["mixed_precision"],
        "config": config,
    }
    return (bs, h if p["kv_heads"] is None else p["kv_heads"]), args, kwargs


def _resize_nearest(p: dict, module: Any) -> Call:
    shape = (p["in_b"], p["in_h"], p["in_w"], p["in_c"])
    out = (p["out_b"], p["out_h"], p["out_w"], p["out_c"])
    return (p["in_b"],), (_placeholder(shape, p["dtype"]), out), {}


def _rmsnorm_qkv(p: dict, module: Any) -> Call:
    hidden = _placeholder((p["batch"], p["seqlen"], p["dim"]), p["dtype"])
    return (), (hidden, _placeholder((p["dim"], p["d_head"]), p["dtype"])), {}


def _select_and_scatter(p: dict, module: Any) -> Call:
    n, c, t = p["n"], p["c"], p["dtype"]
    operand = _placeholder((n, c, p["operand_h"], p["operand_w"]), t)
    source = _placeholder((n, c, p["source_h"], p["source_w"]), t)
    return (), (operand, source), {}


# file: (kernel module under src/nki_samples/reference, kernel, call, target)
TESTS: dict[str, tuple[str, str, Callable[[dict, Any], Call], str]] = {
    "test_SD_attention_small_head.py": (
        "attention", "fused_self_attn_for_SD_small_head_size", _sd_attention, "trn1"),
    "test_adaptive_avg_pool2d.py": (
        "vision", "adaptive_avg_pool2d_kernel", _adaptive_avg_pool2d, "trn1"),
    "test_allocated_SD_attention_small_head.py": (
        "allocated_attention", "allocated_fused_self_attn_for_SD_small_head_size",
        _allocated_sd_attention, "trn1"),
    "test_double_row_matmul.py": (
        "double_row_matmul", "quantized_double_row_matmul", _double_row_matmul, "trn2"),
    "test_flash_attn_bwd.py": ("attention", "flash_attn_bwd", _flash_attn_bwd, "trn1"),
    "test_flash_attn_fwd.py": ("attention", "flash_fwd", _flash_attn_fwd, "trn1"),
    "test_resize_nearest.py": (
        "vision", "resize_nearest_fixed_dma_kernel", _resize_nearest, "trn1"),
    "test_rmsnorm_qkv.py": (
        "allocated_fused_linear", "allocated_fused_rms_norm_qkv", _rmsnorm_qkv, "trn1"),
    "test_select_and_scatter.py": (
        "vision", "select_and_scatter_kernel", _select_and_scatter, "trn1"),
}  # fmt: skip
# The parameters that set a flash attention case's (query, key) lengths (probed shorter).
SEQLENS = {
    "test_flash_attn_bwd.py": ("seqlen", "seqlen"),
    "test_flash_attn_fwd.py": ("seqlen_q", "seqlen_k"),
}


class Samples(PinnedRepo):
    """Files of nki-samples at COMMIT, from a clone or a git directory."""

    def __init__(self, path: pathlib.Path) -> None:
        super().__init__(path, COMMIT)

    def kernels(self, name: str, folder: pathlib.Path) -> Any:
        """The kernel module ``name`` of COMMIT (:func:`import_kernels` of a copy in
        ``folder``)."""
        path = folder / f"{name}.py"
        if not path.is_file():
            path.write_text(self.read(f"{KERNELS}/{name}.py"))
        return import_kernels(path)


def import_kernels(path: pathlib.Path) -> Any:
    """Imports a kernel module of ``src/nki_samples/reference`` (each imports only neuronxcc
    and the standard library) from ``path`` with the simulator installed, as a module of its
    own: ``nki_samples.reference`` would resolve to this script, ``nki_samples``."""
    qualified = f"nki_samples_reference_{path.stem}"
    if qualified not in sys.modules:
        install()
        spec = importlib.util.spec_from_file_location(qualified, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module  # before it runs: dataclasses look it up
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def blob_id(text: str) -> str:
    """Git's object id of a file with contents ``text`` (``git hash-object``): which kernel
    source an estimate is of, checkable against any checkout."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _namespace() -> dict[str, Any]:
    install()
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]

    return {"np": np, "nl": nl}


def cases_of(file: str, text: str) -> Iterator[dict[str, Any]]:
    """The perf test's cases in ``text`` (test file ``file``): parameters, the asserted
    percentile, the threshold (the assertion's right-hand side evaluated per case) and the
    assertion and markers as written."""
    namespace = _namespace()
    tree = ast.parse(text)
    classes = {f: c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    (test,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_perf")
    ]
    grids: list[list[dict[str, Any]]] = []
    markers = []
    for decorator in reversed(test.decorator_list):  # the one nearest the function first
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize"):
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            rows = eval(compile(ast.Expression(decorator.args[1]), file, "eval"), namespace)
            grids.append(
                [dict(zip(names, r if len(names) > 1 else [r], strict=True)) for r in rows]
            )
        else:
            markers.append(ast.unparse(decorator))
    percentiles = {
        node.targets[0].id: node.value.args[0].value  # type: ignore[attr-defined]
        for node in ast.walk(test)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func).endswith("get_latency_percentile")
    }
    (check,) = [
        node
        for node in ast.walk(test)
        if isinstance(node, ast.Assert)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id in percentiles
    ]
    compare = check.test
    assert isinstance(compare, ast.Compare) and isinstance(compare.ops[0], ast.LtE)
    bound = compile(ast.Expression(compare.comparators[0]), file, "eval")
    guards = [ast.unparse(n.test) for n in test.body if isinstance(n, ast.If)]
    for index, combination in enumerate(itertools.product(*grids)):
        params = {k: v for part in combination for k, v in part.items()}
        yield {
            "file": f"test/unit/{file}",
            "test": f"test/unit/{file}::{classes[test]}::{test.name}",
            "case": index,
            "params": params,
            "percentile": percentiles[compare.left.id],  # type: ignore[attr-defined]
            "assertion": ast.unparse(check.test),
            "threshold_us": float(eval(bound, namespace | params)),
            "markers": markers,
            "guards": guards,
        }


def case_name(case: dict[str, Any]) -> str:
    return f"{pathlib.PurePath(case['file']).stem}[{case['case']}]"


def params_of(row: dict[str, Any]) -> dict[str, Any]:
    """A recorded row's parameters as the test passed them (dtypes as ``nl`` dtypes, lists
    as tuples): the inverse of :func:`_describe`."""
    namespace = _namespace()

    def value(name: str, described: Any) -> Any:
        if name == "dtype":
            return getattr(namespace["nl"], described)
        return tuple(described) if isinstance(described, list) else described

    return {name: value(name, v) for name, v in row["params"].items()}


def _describe(value: Any) -> Any:
    """A JSON-able form of a test parameter (dtypes by name)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_describe(v) for v in value]
    return getattr(value, "__name__", None) or str(np.dtype(value))


def trace_of(file: str, kernel_module: Any, params: dict[str, Any]) -> tuple:
    """The kernel of test ``file`` (in ``kernel_module``) run under nki.benchmark on its
    target in trace-only mode with a case's ``params``: (NeuronCore version, trace, seconds)."""
    _, kernel_name, call, target = TESTS[pathlib.PurePath(file).name]
    install()
    import neuronxcc.nki as nki  # type: ignore[import-not-found]

    with runtime.targeting(target), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grid, args, kwargs = call(params, kernel_module)
        bench = nki.benchmark(warmup=1, iters=1)(getattr(kernel_module, kernel_name))
        started = time.perf_counter()
        (bench[grid] if grid else bench)(*args, **kwargs)
        seconds = time.perf_counter() - started
    ((version, instructions),) = runtime.last_traces()
    return version, instructions, seconds


def probe_params(case: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
    """A flash attention case's parameters at PROBE_SEQLEN tokens and the factor its
    simulation time grows by to the case's lengths (query x key); None for other cases."""
    names = SEQLENS.get(pathlib.PurePath(case["file"]).name)
    if names is None:
        return None
    params = dict(case["params"])
    factor = math.prod(params[name] / PROBE_SEQLEN for name in names)
    params |= {name: PROBE_SEQLEN for name in names}
    if params.get("sliding_window", -1) > PROBE_SEQLEN:
        params["sliding_window"] = -1  # a window wider than the probe is causal there
    return params, factor


def simulate(
    case: dict[str, Any],
    samples: Samples,
    folder: pathlib.Path,
    cache: pathlib.Path | None,
    budget_s: float,
) -> dict[str, Any]:
    """Traces ``case`` (from ``cache`` when there) unless a probe predicts it takes longer
    than ``budget_s``: {"trace": (version, instructions, seconds)} or {"predicted_s": ...}
    or {"error": text}."""
    name = case_name(case)
    cached = cache / f"{name}.pkl" if cache else None
    if cached is not None and cached.is_file():
        return {"trace": pickle.loads(cached.read_bytes())}
    try:
        kernel_module = samples.kernels(TESTS[pathlib.PurePath(case["file"]).name][0], folder)
        probe = probe_params(case)
        if probe is not None and probe[1] > 1:
            *_, seconds = trace_of(case["file"], kernel_module, probe[0])
            predicted = seconds * probe[1]
            print(f"{name}: probe {seconds:.0f} s, predicted {predicted / 60:.0f} min",
                  file=sys.stderr, flush=True)  # fmt: skip
            if predicted > budget_s:
                return {"predicted_s": predicted, "probe_s": seconds}
        found = trace_of(case["file"], kernel_module, case["params"])
    except Exception as error:  # the simulator refused or crashed: a finding, kept verbatim
        return {"error": f"{type(error).__name__}: {error}"}
    keep_trace(cached, found, name)
    return {"trace": found}


def row_of(case: dict[str, Any], outcome: dict[str, Any], kernel_blob: str) -> dict[str, Any]:
    """The recorded row: citation, threshold, and the estimate or why there is none."""
    module, kernel, _, target = TESTS[pathlib.PurePath(case["file"]).name]
    row = {
        "case": case_name(case),
        "file": case["file"],
        "citation": f"{REPO}@{COMMIT} {case['test']} (case {case['case']})",
        "kernel": f"{KERNELS}/{module}.py:{kernel}",
        "kernel_blob": kernel_blob,
        "params": {k: _describe(v) for k, v in case["params"].items()},
        "percentile": case["percentile"],
        "assertion": case["assertion"],
        "threshold_us": round(case["threshold_us"], 3),
        "vacuous": case["threshold_us"] >= VACUOUS_US,
        "markers": case["markers"],
        "guards": case["guards"],
        "target": target,
    }
    if "trace" in outcome:
        version, instructions, seconds = outcome["trace"]
        result = estimate(instructions, version)
        row |= {
            "estimate_us": round(result.latency_us, 3),
            "ratio": float(f"{result.latency_us / case['threshold_us']:.4g}"),
            "bound": result.bound,
            "band_us": [round(b, 3) for b in result.band_us] if result.band_us else None,
            "simulate_s": round(seconds, 1),
        }
    elif "predicted_s" in outcome:
        row |= {"not_simulated": f"would take ~{outcome['predicted_s'] / 60:.0f} min "
                f"(a {PROBE_SEQLEN}-token probe took {outcome['probe_s']:.0f} s)"}  # fmt: skip
    else:
        row["error"] = outcome["error"]
    return row


START, END = "<!-- nki_samples.py: start -->", "<!-- nki_samples.py: end -->"


def render(record: dict[str, Any]) -> str:
    """The README section, from ``record``."""
    rows = record["rows"]
    # bounds a passing test set: not vacuous, and not on a test expected to fail (xfail)
    estimated = [
        r
        for r in rows
        if "estimate_us" in r and not r["vacuous"] and not any("xfail" in m for m in r["markers"])
    ]
    within = [r for r in estimated if r["ratio"] <= 1.0]
    worst = max(estimated, key=lambda r: r["ratio"], default=None)
    largest = (
        f"; largest estimate / threshold {worst['ratio']:.2f} ({worst['case']})" if worst else ""
    )
    lines = [
        START,
        "## nki-samples CI thresholds (upper bounds, not measurements)",
        "",
        f"Generated by `{record['command']}` from {REPO}@{COMMIT} (fc5c69f^, the last commit "
        "with the perf checks): each `test/unit/*_perf` test asserted that the device's "
        "latency percentile was at or below a threshold, in microseconds as "
        f"`get_latency_percentile` returns it ({UNIT_SOURCE}). A passing test says the device "
        "ran at least that fast and no more: an estimate above its threshold over-estimates "
        "the device; one far below it says little (the device may have been far faster than "
        "the threshold too). The device is not stated; trn1 was among the targets (the tests' "
        "history), so the kernels are estimated on NeuronCore-v2, except double_row_matmul, "
        "whose test only asserts on trn2 (NeuronCore-v3). The kernels of the same commit ran "
        "unchanged through `nki.benchmark` in trace-only mode.",
        "",
        f"Within the bound: {len(within)} of the {len(estimated)} estimated cases whose "
        f"threshold is a bound (not vacuous, not on an xfail test){largest}.",
        "",
        "| case | kernel | percentile | threshold us | estimate us (band) | estimate / threshold "
        "| bound | simulate s |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        kernel = r["kernel"].rpartition(":")[2] + ("" if r["target"] == "trn1" else " (trn2)")
        threshold = f"{r['threshold_us']:g}" + (" (vacuous)" if r["vacuous"] else "")
        if "estimate_us" in r:
            band = "" if r["band_us"] is None else " ({:.1f}-{:.1f})".format(*r["band_us"])
            figures = (f"{r['estimate_us']:.1f}{band} | {r['ratio']:.3g} | {r['bound']} | "
                       f"{r['simulate_s']:.1f}")  # fmt: skip
        elif "not_simulated" in r:
            figures = f"not simulated: {r['not_simulated']} | | |"
        else:
            figures = f"error: `{r['error'][:160]}` | | |"
        lines.append(f"| {r['case']} | {kernel} | P{r['percentile']} | {threshold} | {figures} |")
    notes = sorted({f"{r['case'].partition('[')[0]}: {', '.join(r['markers'])}"
                    for r in rows if r["markers"]})  # fmt: skip
    vacuous = [r for r in rows if r["vacuous"]]
    if vacuous:
        tests = ", ".join(sorted({r["case"].partition("[")[0] for r in vacuous}))
        seconds = [r["threshold_us"] / 1e6 for r in vacuous]
        lines += [
            "",
            f"Thresholds marked vacuous are {VACUOUS_US / 1e6:.0f} s or more ({tests}: "
            f"{min(seconds):.0f}-{max(seconds):.0f} s): read in microseconds they bound "
            "nothing, and no other unit is stated in the repository; their ratios are listed "
            "but not counted.",
        ]
    if notes:
        lines.append("")
        lines.append("Markers on the perf test (an expected failure is no bound the device met): "
                     + "; ".join(f"`{n}`" for n in notes) + ".")  # fmt: skip
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=pathlib.Path, help="nki-samples clone or git directory")
    parser.add_argument("--traces", type=pathlib.Path, help="keep traces here (and reuse them)")
    parser.add_argument("--budget-min", type=float, default=10.0,
                        help="skip a case whose probe predicts a longer simulation")  # fmt: skip
    parser.add_argument("--only", nargs="*", help="only these test files (e.g. test_rmsnorm_qkv): "
                        "their rows of --out are replaced, the others kept")  # fmt: skip
    parser.add_argument("--out", default=str(HERE / "nki_samples.json"))
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's section")
    args = parser.parse_args()
    samples = Samples(args.samples)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for file in TESTS:
            if args.only and pathlib.PurePath(file).stem not in args.only:
                continue
            blob = blob_id(samples.read(f"{KERNELS}/{TESTS[file][0]}.py"))
            for case in cases_of(file, samples.read(f"test/unit/{file}")):
                outcome = simulate(
                    case, samples, pathlib.Path(folder), args.traces, args.budget_min * 60
                )
                rows.append(row_of(case, outcome, blob))
    command = (
        "PYTHONPATH=. python benchmarks/nki_estimate/nki_samples.py NKI_SAMPLES"
        + (" --traces DIR" if args.traces else "")
        + (f" --budget-min {args.budget_min:g}" if args.budget_min != 10.0 else "")
    )
    out = pathlib.Path(args.out)
    if args.only and out.is_file():  # the other files' rows as recorded
        fresh = {row["case"]: row for row in rows}
        kept = json.loads(out.read_text())
        rows = [fresh.pop(row["case"], row) for row in kept["rows"]] + list(fresh.values())
        command = f"{kept['command']}`, then `{command} --only {' '.join(args.only)}"
    record = {
        "command": command,
        "source": f"{REPO}@{COMMIT} test/unit/*.py (perf tests removed by fc5c69f)",
        "unit": f"microseconds ({UNIT_SOURCE})",
        "statistic": "upper bound: the test asserted percentile <= threshold on a device",
        "rows": rows,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    if args.readme:
        write_section(render(record), HERE / "README.md")
    print(render(record))


if __name__ == "__main__":
    main()
