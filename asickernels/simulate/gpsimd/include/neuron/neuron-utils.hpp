// Host shim of the GpSimd <neuron/neuron-utils.hpp>: which core is running, how many run,
// and the operator's output tensor. Valid only inside a kernel run by the shim's runner.
#pragma once

#include <cstdint>

#include <torch/torch.h>

// This core's id, in [0, get_cpu_count()).
uint32_t get_cpu_id();
// The number of GpSimd cores that each run the whole kernel: 8 on NeuronCore-v2.
uint32_t get_cpu_count();
// The operator's output tensor; mandatory in multicore mode (the return value is ignored).
torch::Tensor get_dst_tensor();
