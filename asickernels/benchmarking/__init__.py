"""The checking and timing harness behind ``asickernels check``, ``bench`` and ``run``.

* :mod:`~asickernels.benchmarking.workloads`: how a workload (each op's sizes, inputs and
  comparison with the float64 reference, declared with its cases in
  ``asickernels/kernels/<op>_cases.py``) is called on a backend.
* :mod:`~asickernels.benchmarking.peers`: implementations that are not ours (torchvision,
  a numpy NMS; the registered ``"xla"`` backend counts as a peer too).
* :mod:`~asickernels.benchmarking.harness`: ``check`` and ``bench`` over every registered
  backend and peer.
* :mod:`~asickernels.benchmarking.timing` and :mod:`~asickernels.benchmarking.device`: how
  a call is timed, on CPU and on devices.
* :mod:`~asickernels.benchmarking.report`, :mod:`~asickernels.benchmarking.schema` and
  :mod:`~asickernels.benchmarking.markdown`: tables, the JSON schema, ``benchmarks/README.md``.
"""
