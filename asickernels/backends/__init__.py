"""The backends, in registration order (``registry.backends_for`` lists them so).

A backend is a subpackage here whose ``__init__`` defines ``BACKEND`` (a
:class:`~asickernels.kernels.registry.Backend` with ``package=__name__``), with one module
per kernel declaring what it implements and supports where the kernel is written
(``@BACKEND.implements(ops.giou, dtypes=...)``, ``ops`` being
:mod:`asickernels.kernels.public`). Where it stands among the others is each op's
``preference``. A backend's kernel modules are imported when it is first asked about.
"""

from __future__ import annotations

from asickernels.backends import cpu, gpsimd, nki, pallas_tpu, xla
from asickernels.kernels.registry import REFERENCE, register_backend

for backend in (
    REFERENCE,
    xla.BACKEND,
    cpu.BACKEND,
    pallas_tpu.BACKEND,
    pallas_tpu.INTERPRET_BACKEND,
    gpsimd.BACKEND,
    nki.BACKEND,
):
    register_backend(backend)
