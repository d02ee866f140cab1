"""TPU kernel time estimates from the real TPU compiler's schedule (no TPU needed).

* :mod:`.parsing`: reads libtpu's final VLIW bundle listings into programs;
* :mod:`.scalar`: the scalar unit's semantics (registers, SMEM slots, DMA/HBM clock);
* :mod:`.walk`: walks a compiled executable's programs to count cycles;
* :mod:`.estimate`: compiles a case for a generation with dumps and turns the walk into
  seconds (``asickernels estimate``);
* :mod:`.roofline`: the physical lower bound of each case (bytes over HBM bandwidth,
  operations over the MXU or VPU peak);
* :mod:`.cases`, :mod:`.seed_kernels`: cases that are not ours (XLA's, the seeds' designs);
* :mod:`.program_facts`: a function's Pallas kernels (grid, TensorCore split) and floor,
  from its jaxpr;
* :mod:`.observed`: what a run on example inputs says of data-dependent loops and branches
  (XLA ``while`` trips; inside Pallas kernels, branch rates, loop trips, grid steps and
  block fetches);
* :mod:`.user_function`: :func:`estimate_function`, the estimate of any jitted function or
  Pallas kernel with example arguments.

Generation facts come from :mod:`asickernels.tpu_generations`. Our kernels' cases, the
estimate table and the ``asickernels estimate`` command are above the kernels, in
:mod:`asickernels.estimates`.
"""

from asickernels.simulate.tpu_estimate.user_function import estimate_function

__all__ = ["estimate_function"]
