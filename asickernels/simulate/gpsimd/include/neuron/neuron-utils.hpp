// Host shim of the GpSimd <neuron/neuron-utils.hpp>: which core is running, how many run,
// and the operator's output tensor. Valid only inside a kernel run by the shim.
#pragma once

#include <cstdint>

#include <torch/torch.h>

// This core's id, in [0, get_cpu_count()).
uint32_t get_cpu_id();
// The GpSimd cores running the kernel: 8 on NeuronCore-v2 in multicore mode, else 1.
uint32_t get_cpu_count();
// The operator's output tensor. Once a kernel calls it, its return value is ignored; in
// multicore mode it is mandatory (custom-ops-ref-guide "Return Value Handling").
torch::Tensor get_dst_tensor();
