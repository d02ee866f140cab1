// Greedy (sequential) NMS for the GpSimd engine, multicore: image b of the batch runs on
// core b % get_cpu_count() and that core alone writes output row b, so the cores need no
// synchronization. Within an image the algorithm is sequential, which suits the engine's
// general-purpose cores: select the eligible candidates, sort them lazily (a sorted prefix
// that grows only while the greedy pass needs more), keep each candidate unless it
// overlaps an already kept box of its category, stop at max_output_size.
//
//   boxes [B, N, 4] kFloat, scores [B, N] kFloat, categories [B, N] kInt (zeros for plain
//   NMS); iou_threshold, max_output_size (M, an integer passed as a double: the only scalar
//   dtype custom operators take), score_threshold (-inf for none).
//   Output [B, M + 1] kInt: column 0 the number kept, then the kept indices in selection
//   order, padded with -1.
//
// Semantics (asickernels/kernels/nms.py): eligible = score not NaN and >= score_threshold;
// visit by descending score, equal scores (-0.0 == 0.0) by ascending index; suppress when
// IoU with a kept box of the same category is > iou_threshold; IoU = inter / union when
// union > 0 else 0, and 0 when either box has a non-finite coordinate. IoU is computed in
// double so every decision matches the float64 reference exactly on float32 boxes.
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>

namespace {

// One 4 KB TCM buffer stages every transfer between NeuronCore memory and the core.
constexpr size_t kStageBytes = 4096;
constexpr size_t kStageFloats = kStageBytes / sizeof(float);
constexpr size_t kStageInts = kStageBytes / sizeof(int32_t);
// The first sorted prefix holds this many candidates (or 2 M); later ones double.
constexpr size_t kFirstSortedBlock = 256;

// Visiting order as one integer: ascending keys are descending scores, then ascending
// indices. Keys are unique, so any sort gives the stable order the reference uses.
uint64_t visit_key(float score, uint32_t index) {
  const float normalized = score + 0.0f;  // -0.0 -> +0.0: the two scores tie
  uint32_t bits;
  std::memcpy(&bits, &normalized, sizeof(bits));
  bits = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);  // monotone in the value
  return (static_cast<uint64_t>(~bits) << 32) | index;
}

struct KeptBox {
  double x1, y1, x2, y2, area;
  int32_t category;
};

bool overlaps_above(const KeptBox& candidate, const KeptBox& kept, double iou_threshold) {
  const double inter_w =
      std::max(0.0, std::min(candidate.x2, kept.x2) - std::max(candidate.x1, kept.x1));
  const double inter_h =
      std::max(0.0, std::min(candidate.y2, kept.y2) - std::max(candidate.y1, kept.y1));
  const double inter = inter_w * inter_h;
  const double union_area = candidate.area + kept.area - inter;
  const double iou = union_area > 0.0 ? inter / union_area : 0.0;
  return iou > iou_threshold;
}

// Copies elements [offset, offset + count) of a tensor into host memory through TCM.
template <typename T, typename Accessor>
void read_through_tcm(Accessor& accessor, T* stage, size_t stage_elems, size_t offset,
                      size_t count, T* destination) {
  for (size_t done = 0; done < count; done += stage_elems) {
    const size_t step = std::min(stage_elems, count - done);
    accessor.template tensor_to_tcm<T>(stage, offset + done, step);
    std::memcpy(destination + done, stage, step * sizeof(T));
  }
}

// Per-core working memory, reused across the images of the core.
struct Workspace {
  std::vector<float> boxes;
  std::vector<int32_t> categories;
  std::vector<uint64_t> keys;
  std::vector<KeptBox> kept;       // kept boxes with finite coordinates
  std::vector<int32_t> selected;  // kept indices, in selection order
};

// Sorts the next block of candidates into place after the already sorted prefix.
void extend_sorted_prefix(std::vector<uint64_t>& keys, size_t& sorted, size_t& block) {
  const size_t end = std::min(keys.size(), sorted + block);
  if (end < keys.size()) std::nth_element(keys.begin() + sorted, keys.begin() + end, keys.end());
  std::sort(keys.begin() + sorted, keys.begin() + end);
  sorted = end;
  block *= 2;
}

void greedy_select(Workspace& work, size_t max_output_size, double iou_threshold) {
  work.kept.clear();
  work.selected.clear();
  size_t sorted = 0;
  size_t block = std::max(kFirstSortedBlock, 2 * max_output_size);
  for (size_t position = 0;
       position < work.keys.size() && work.selected.size() < max_output_size; ++position) {
    if (position == sorted) extend_sorted_prefix(work.keys, sorted, block);
    const auto index = static_cast<uint32_t>(work.keys[position]);
    const float* box = &work.boxes[4 * static_cast<size_t>(index)];
    const bool finite = std::isfinite(box[0]) && std::isfinite(box[1]) &&
                        std::isfinite(box[2]) && std::isfinite(box[3]);
    if (finite) {
      const double area = (double(box[2]) - double(box[0])) * (double(box[3]) - double(box[1]));
      const KeptBox candidate{box[0], box[1], box[2], box[3], area, work.categories[index]};
      const bool suppressed =
          std::any_of(work.kept.begin(), work.kept.end(), [&](const KeptBox& kept) {
            return kept.category == candidate.category &&
                   overlaps_above(candidate, kept, iou_threshold);
          });
      if (suppressed) continue;
      work.kept.push_back(candidate);
    }
    work.selected.push_back(static_cast<int32_t>(index));
  }
}

}  // namespace

torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                  const torch::Tensor& categories, double iou_threshold,
                  double max_output_size, double score_threshold) {
  torch::Tensor out = get_dst_tensor();
  const size_t batch = static_cast<size_t>(scores.sizes()[0]);
  const size_t n = static_cast<size_t>(scores.sizes()[1]);
  const size_t max_kept = static_cast<size_t>(max_output_size);
  const size_t row_length = max_kept + 1;

  void* stage = torch::neuron::tcm_malloc(kStageBytes);
  if (stage != nullptr) {
    auto* stage_floats = static_cast<float*>(stage);
    auto* stage_ints = static_cast<int32_t*>(stage);
    auto box_reader = boxes.tcm_accessor();
    auto score_reader = scores.tcm_accessor();
    auto category_reader = categories.tcm_accessor();
    auto writer = out.tcm_accessor();
    Workspace work;
    for (size_t image = get_cpu_id(); image < batch; image += get_cpu_count()) {
      work.keys.clear();
      for (size_t first = 0; first < n; first += kStageFloats) {
        const size_t count = std::min(kStageFloats, n - first);
        score_reader.tensor_to_tcm<float>(stage_floats, image * n + first, count);
        for (size_t j = 0; j < count; ++j) {
          const float score = stage_floats[j];
          if (!std::isnan(score) && double(score) >= score_threshold) {
            work.keys.push_back(visit_key(score, static_cast<uint32_t>(first + j)));
          }
        }
      }
      work.boxes.resize(4 * n);
      read_through_tcm(box_reader, stage_floats, kStageFloats, image * n * 4, 4 * n,
                       work.boxes.data());
      work.categories.resize(n);
      read_through_tcm(category_reader, stage_ints, kStageInts, image * n, n,
                       work.categories.data());
      greedy_select(work, max_kept, iou_threshold);
      const size_t kept = work.selected.size();
      for (size_t first = 0; first < row_length; first += kStageInts) {
        const size_t count = std::min(kStageInts, row_length - first);
        for (size_t j = 0; j < count; ++j) {
          const size_t column = first + j;
          stage_ints[j] = column == 0 ? static_cast<int32_t>(kept)
                          : column <= kept ? work.selected[column - 1]
                                           : -1;
        }
        writer.tcm_to_tensor<int32_t>(stage_ints, image * row_length + first, count);
      }
    }
  }
  torch::neuron::tcm_free(stage);
  return out;
}
