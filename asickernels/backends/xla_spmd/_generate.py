"""How an SPMD wrapper is generated from an op declaration, for both frontends: the op's
signature plus ``mesh`` and the parameters of its partition rule, bound and handed to the
frontend's rule function."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from asickernels.kernels.declaration import Op

# The partition parameters of each rule (``Op.partition``): a rule gets their values.
PARTITION_PARAMS = {
    "batch": ("batch_spec",),
    "loss": ("batch_spec",),
    "matmul": ("m_axis", "k_axis", "n_axis"),
}

Rule = Callable[..., Any]  # (op, mesh, layout, arrays, options) -> outputs


def sharded_wrapper(
    op: Op, signature: inspect.Signature, rules: Mapping[str, Rule], where: str
) -> Callable[..., Any]:
    """The wrapper of ``op`` for one frontend. ``signature`` is the frontend's signature of
    the op (its last parameter is ``backend`` or ``config``, kept last); a rule is called as
    ``rule(op, mesh, layout, arrays, options)``, where ``layout`` is ``batch_spec`` or the
    ``(m_axis, k_axis, n_axis)`` tuple and ``options`` the static arguments and backend."""
    names = PARTITION_PARAMS[op.partition]
    extra = [inspect.Parameter("mesh", inspect.Parameter.KEYWORD_ONLY)] + [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if name == "batch_spec" else None,
        )
        for name in names
    ]
    parameters = list(signature.parameters.values())
    trailing = [p for p in parameters if p.name in ("backend", "config")]
    leading = [p for p in parameters if p.name not in ("backend", "config")]
    full = signature.replace(parameters=[*leading, *extra, *trailing])
    rule = rules[op.partition]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = full.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        mesh = values.pop("mesh")
        layout = tuple(values.pop(name) for name in names)
        arrays = {n: values.pop(n) for n in op.array_names}
        return rule(op, mesh, layout[0] if len(layout) == 1 else layout, arrays, values)

    wrapper.__name__ = wrapper.__qualname__ = op.name
    wrapper.__signature__ = full  # type: ignore[attr-defined]
    wrapper.__doc__ = (
        f"``{op.name}`` over {where} (partition rule {op.partition!r}: "
        f"{', '.join(names)}; see the module docstring)."
    )
    return wrapper
