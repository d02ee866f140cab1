"""TPU kernel time estimates from the real TPU compiler's schedule (no TPU needed).

* :mod:`.parsing`: reads libtpu's final VLIW bundle listings into programs;
* :mod:`.scalar`: the scalar unit's semantics (registers, SMEM slots, DMA/HBM clock);
* :mod:`.walk`: walks a compiled executable's programs to count cycles;
* :mod:`.estimate`: compiles a case for a generation with dumps and turns the walk into
  seconds (``asickernels estimate``);
* :mod:`.roofline`: the physical lower bound of each case (bytes over HBM bandwidth,
  operations over the MXU or VPU peak);
* :mod:`.cases`, :mod:`.seed_kernels`: what is estimated (ours, XLA's, the seeds' designs);
* :mod:`.report`: tables, calibration, sweeps, markdown and JSON.

Generation facts come from :mod:`asickernels.tpu_generations`.
"""
