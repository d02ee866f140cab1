// Shape functions and registration of the asickernels GpSimd library. They run on the host
// when torch-neuronx traces the model, see only shapes, and take each kernel's exact
// signature. The ops are torch.ops.asickernels_gpsimd.{giou,nms}.
#include <stdint.h>
#include <stdlib.h>

#include <torch/torch.h>

#include "torchneuron/register.h"

// [..., 4] box pairs -> [...] kFloat GIOU.
torch::Tensor giou_shape(const torch::Tensor& boxes1, const torch::Tensor& /*boxes2*/) {
  const torch::IntArrayRef sizes = boxes1.sizes();
  return torch::zeros(sizes.slice(0, sizes.size() - 1), torch::kFloat);
}

// [B, N] scores -> [B, max_output_size + 1] kInt: the count kept, then the indices.
// max_output_size is a double holding an integer: double is the only scalar dtype a custom
// operator may take (custom-c++-operators-devguide "Kernel Function").
torch::Tensor nms_shape(const torch::Tensor& /*boxes*/, const torch::Tensor& scores,
                        const torch::Tensor& /*categories*/, double /*iou_threshold*/,
                        double max_output_size, double /*score_threshold*/) {
  return torch::zeros({scores.sizes()[0], static_cast<int64_t>(max_output_size) + 1}, torch::kInt);
}

NEURON_LIBRARY(asickernels_gpsimd, m) {
  m.def("giou", &giou_shape, "giou");
  m.def("nms", &nms_shape, "nms");
}
