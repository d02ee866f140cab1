"""``python -m asickernels.simulate.nki script.py [args...]``: runs a script that imports
``nki`` or ``neuronxcc.nki`` unchanged on the simulator (see :mod:`.install`)."""

from __future__ import annotations

import os
import runpy
import sys

from asickernels.simulate.nki.install import install


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if not os.path.exists(argv[0]):  # as `python missing.py` says it, without a traceback
        print(f"asickernels.simulate.nki: cannot open {argv[0]!r}: no such file", file=sys.stderr)
        return 2
    hooked = install()
    if hooked:
        print(f"[asickernels] simulating {', '.join(hooked)} on the CPU", file=sys.stderr)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script.py`
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
