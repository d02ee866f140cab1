"""``python -m asickernels``: the ``asickernels`` command."""

from asickernels.cli import main

raise SystemExit(main())
