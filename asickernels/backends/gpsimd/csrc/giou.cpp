// GIOU forward for the GpSimd engine, multicore: every one of the get_cpu_count() cores
// runs this function on its own contiguous slice of the box pairs and writes only that
// slice of the output, so no synchronization is needed. Any pair count works: the
// remainder of pairs / cores goes one pair each to the first cores.
//
//   boxes1, boxes2: [..., 4] kFloat (x1, y1, x2, y2); output: [...] kFloat
//   giou = inter / (union + eps) - (hull - union) / (hull + eps), eps = 1e-7
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>

#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>

namespace {

// Pairs staged per TCM round trip: two 4 KB box buffers and a 1 KB output buffer, 9 KB of
// the 16 KB TCM pool.
constexpr size_t kPairsPerChunk = 256;
constexpr float kEps = 1e-7f;

inline float giou_of_pair(const float* a, const float* b) {
  const float inter_w = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const float inter_h = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  const float inter = (inter_w > 0.f ? inter_w : 0.f) * (inter_h > 0.f ? inter_h : 0.f);
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]);
  const float area_b = (b[2] - b[0]) * (b[3] - b[1]);
  const float union_area = area_a + area_b - inter;
  const float hull = (std::max(a[2], b[2]) - std::min(a[0], b[0])) *
                     (std::max(a[3], b[3]) - std::min(a[1], b[1]));
  return inter / (union_area + kEps) - (hull - union_area) / (hull + kEps);
}

}  // namespace

torch::Tensor giou(const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  torch::Tensor out = get_dst_tensor();
  const size_t pairs = static_cast<size_t>(out.numel());
  const size_t cores = get_cpu_count();
  const size_t core = get_cpu_id();
  const size_t share = pairs / cores;
  const size_t extra = pairs % cores;
  const size_t begin = core * share + std::min(core, extra);
  const size_t end = begin + share + (core < extra ? 1 : 0);

  auto* tcm_a = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kPairsPerChunk));
  auto* tcm_b = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kPairsPerChunk));
  auto* tcm_out = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * kPairsPerChunk));
  if (tcm_a != nullptr && tcm_b != nullptr && tcm_out != nullptr) {
    auto in_a = boxes1.tcm_accessor();
    auto in_b = boxes2.tcm_accessor();
    auto result = out.tcm_accessor();
    for (size_t first = begin; first < end; first += kPairsPerChunk) {
      const size_t count = std::min(kPairsPerChunk, end - first);
      // Offsets are in elements of the flattened tensors: 4 floats per box, 1 per result.
      in_a.tensor_to_tcm<float>(tcm_a, first * 4, count * 4);
      in_b.tensor_to_tcm<float>(tcm_b, first * 4, count * 4);
      for (size_t j = 0; j < count; ++j) tcm_out[j] = giou_of_pair(tcm_a + 4 * j, tcm_b + 4 * j);
      result.tcm_to_tensor<float>(tcm_out, first, count);
    }
  }
  torch::neuron::tcm_free(tcm_out);
  torch::neuron::tcm_free(tcm_b);
  torch::neuron::tcm_free(tcm_a);
  return out;
}
