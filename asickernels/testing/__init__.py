"""What the conformance suite and ``asickernels check`` run every backend on."""
