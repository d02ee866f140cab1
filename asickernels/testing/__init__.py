"""The detection models the detection tests and benchmarks share (each op's own cases live
beside its declaration, ``asickernels/kernels/<op>_cases.py``)."""
