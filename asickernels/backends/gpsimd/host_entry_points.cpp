// The host build's C entry points: numpy buffers in, the ops run through the GpSimd shim
// exactly as torch-neuronx would run them (shape function, then the kernel on all cores).
// Each returns 0, or 1 with a message in `error`.
#include <cstddef>
#include <cstdint>

#include "asickernels_shim/runner.hpp"

// The compute sources (csrc/giou.cpp, csrc/nms.cpp).
torch::Tensor giou(const torch::Tensor& boxes1, const torch::Tensor& boxes2);
torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                  const torch::Tensor& categories, double iou_threshold,
                  int64_t max_output_size, double score_threshold);

namespace shim = asickernels_shim;

// boxes1, boxes2: [pairs, 4] float32; out: [pairs] float32.
extern "C" int asickernels_gpsimd_giou(const float* boxes1, const float* boxes2, int64_t pairs,
                                       float* out, char* error, size_t error_size) {
  return shim::guarded(error, error_size, [&] {
    shim::run_op("giou", "giou", &giou, shim::output(out, {pairs}),
                 shim::input(boxes1, {pairs, 4}), shim::input(boxes2, {pairs, 4}));
  });
}

// boxes: [batch, n, 4] float32; scores: [batch, n] float32; categories: [batch, n] int32;
// out: [batch, max_output_size + 1] int32.
extern "C" int asickernels_gpsimd_nms(const float* boxes, const float* scores,
                                      const int32_t* categories, int64_t batch, int64_t n,
                                      double iou_threshold, int64_t max_output_size,
                                      double score_threshold, int32_t* out, char* error,
                                      size_t error_size) {
  return shim::guarded(error, error_size, [&] {
    shim::run_op("nms", "nms", &nms, shim::output(out, {batch, max_output_size + 1}),
                 shim::input(boxes, {batch, n, 4}), shim::input(scores, {batch, n}),
                 shim::input(categories, {batch, n}), iou_threshold, max_output_size,
                 score_threshold);
  });
}
