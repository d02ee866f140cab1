"""The JSON that ``asickernels check/bench/run --json PATH`` writes (schema ``asickernels-bench/1``).

Top level (an object)::

    schema     "asickernels-bench/1"
    command    str     the command line that produced the file
    created    str     ISO 8601 UTC time
    machine    object  cpu_model str, cores int, platform str, python str,
                       jax_backend str, devices [str], load_average [number]
                       (1, 5, 15 minutes, when the file was written)
    versions   object  package name -> version str, or null when not installed
    settings   object  bench settings (sizes per op, repeats, ...), or null (check only)
    checks     [check row]   empty when no check ran
    results    [bench row]   empty when no bench ran

Check row (one op x case x backend; ``case`` is ``"*"`` for a backend that cannot run)::

    op, case, implementation, mode ("native" | "simulated" | "missing"),
    status ("ok" | "fail" | "error" | "missing" | "n/a": the backend refuses the case by
    design, e.g. float64 on a float32-only backend; detail says why), max_error (number |
    null), tolerance (number | null), detail (str)

Bench row (one op x size x backend or peer)::

    op, size (label), params (object: the size's parameters), implementation,
    role ("ours" | "peer" | "reference"), mode, status ("ok" | "fail" | "error" |
    "missing" | "skipped" | "n/a"), detail (why not ok), max_error, tolerance, checked (which part
    of the output was compared, or null), timing (null, or object: median_s, min_s, p10_s,
    p90_s, max_s, repeats int, first_call_s number | null, method str),
    ratio_to_fastest_peer (median / the fastest peer's median at the same op and size, or
    null), counters (object: name -> number, from the backend's ``counters``)

A row passes when ``max_error <= tolerance``. What they measure depends on the op:

* float outputs (GIOU, its gradient, the box metrics): the worst
  ``|got - want| / (atol + rtol |want|)``, in units of the op's tolerance for the output
  dtype (:func:`asickernels.kernels.oracle.tolerance`); ``tolerance`` is 1.
* exact outputs (NMS): the number of differing entries; ``tolerance`` is 0.
* int8 matmul: the largest absolute difference of int32 outputs (``tolerance`` 0), or the
  largest relative difference of dequantized ones (``tolerance``: the output dtype's rtol).
"""

from __future__ import annotations

from typing import Any

SCHEMA = "asickernels-bench/1"

_NUMBER = (int, float)
_OPTIONAL_NUMBER = (int, float, type(None))
_MODES = ("native", "simulated", "missing")

_TOP = {
    "schema": str,
    "command": str,
    "created": str,
    "machine": dict,
    "versions": dict,
    "settings": (dict, type(None)),
    "checks": list,
    "results": list,
}
_MACHINE = {
    "cpu_model": str,
    "cores": int,
    "platform": str,
    "python": str,
    "jax_backend": str,
    "devices": list,
    "load_average": list,
}
_CHECK = {
    "op": str,
    "case": str,
    "implementation": str,
    "mode": str,
    "status": str,
    "max_error": _OPTIONAL_NUMBER,
    "tolerance": _OPTIONAL_NUMBER,
    "detail": str,
}
_BENCH = {
    "op": str,
    "size": str,
    "params": dict,
    "implementation": str,
    "role": str,
    "mode": str,
    "status": str,
    "detail": str,
    "max_error": _OPTIONAL_NUMBER,
    "tolerance": _OPTIONAL_NUMBER,
    "checked": (str, type(None)),
    "timing": (dict, type(None)),
    "ratio_to_fastest_peer": _OPTIONAL_NUMBER,
    "counters": dict,
}
_TIMING = {
    "median_s": _NUMBER,
    "min_s": _NUMBER,
    "p10_s": _NUMBER,
    "p90_s": _NUMBER,
    "max_s": _NUMBER,
    "repeats": int,
    "first_call_s": _OPTIONAL_NUMBER,
    "method": str,
}
_CHOICES = {
    "mode": _MODES,
    "role": ("ours", "peer", "reference"),
}


def _fields(value: Any, spec: dict[str, Any], where: str) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    if set(value) != set(spec):
        missing, extra = sorted(set(spec) - set(value)), sorted(set(value) - set(spec))
        raise ValueError(f"{where}: missing fields {missing}, unexpected fields {extra}")
    for key, types in spec.items():
        item = value[key]
        if isinstance(item, bool) or not isinstance(item, types):
            raise ValueError(f"{where}.{key}: unexpected type {type(item).__name__}")
        if key in _CHOICES and item not in _CHOICES[key]:
            raise ValueError(f"{where}.{key}: {item!r} is not one of {_CHOICES[key]}")


def validate(document: Any) -> None:
    """Raises ValueError (naming the offending field) unless ``document`` follows the schema."""
    _fields(document, _TOP, "document")
    if document["schema"] != SCHEMA:
        raise ValueError(f"document.schema: expected {SCHEMA!r}, got {document['schema']!r}")
    _fields(document["machine"], _MACHINE, "machine")
    for i, row in enumerate(document["checks"]):
        _fields(row, _CHECK, f"checks[{i}]")
        if row["status"] not in ("ok", "fail", "error", "missing", "n/a"):
            raise ValueError(f"checks[{i}].status: unexpected {row['status']!r}")
    for i, row in enumerate(document["results"]):
        _fields(row, _BENCH, f"results[{i}]")
        if row["status"] not in ("ok", "fail", "error", "missing", "skipped", "n/a"):
            raise ValueError(f"results[{i}].status: unexpected {row['status']!r}")
        if row["timing"] is not None:
            _fields(row["timing"], _TIMING, f"results[{i}].timing")
        if (row["status"] == "ok") != (row["timing"] is not None):
            raise ValueError(f"results[{i}]: a timing must be present exactly when status is 'ok'")
