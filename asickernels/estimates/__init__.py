"""The simulators applied to our own kernels: above both the op layer
(:mod:`asickernels.kernels`) and the backends, which the simulators
(:mod:`asickernels.simulate`) never import.

* :mod:`.compile_gate`: ``asickernels compile``, every Pallas kernel at its benchmark shapes
  compiled for real TPU generations with libtpu;
* :mod:`.tpu_cases`: our kernels' TPU estimate cases (builders, workloads, NMS loop trips);
* :mod:`.tpu_report`: the TPU estimate table, calibration, block-size sweeps, markdown, JSON;
* :mod:`.nki_estimates`: our NKI kernels' modelled NeuronCore times (``--neuron``);
* :mod:`.command`: ``asickernels estimate``.
"""
