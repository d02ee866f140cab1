// Greedy NMS per image (asickernels/kernels/nms.py's rule, torchvision's decisions).
//
// Eligible boxes (score not NaN and >= score_threshold) form a pool of visiting keys
// (descending score, -0.0 == 0.0, then ascending index). The pool is consumed in sorted
// blocks: the best `block` keys are selected (nth_element) and sorted, and each is checked
// against the kept boxes in order. After a block in which most candidates were suppressed,
// the rest of the pool is swept against the boxes kept since the last sweep and the
// suppressed ones are dropped, so overlapping workloads never sort what they discard, and
// sparse ones stop after sorting little more than max_output_size keys.
//
// IoU is computed in double in the reference's operation order (the build disables FMA
// contraction), so every decision equals the float64 reference's. A box with a non-finite
// coordinate is replaced by (0, 0, 0, 0), whose IoU with any box is 0: it is never
// suppressed and suppresses nothing, as the reference defines.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "csrc/kernels.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace asickernels_cpu {

// The statics, as the FFI handlers' attributes of these names bring them (AK_ATTRIBUTES).
struct NmsParams {
  double iou_threshold;
  int64_t max_output_size;
  double score_threshold;  // -inf for none
};

// Greedy NMS per image: boxes [B, N, 4], scores [B, N], categories [B, N] or nullptr ->
// indices [B, max_output_size] (padded with -1), num_valid [B]. T is float or double; the
// IoU decisions are made in double whatever T.
AK_EVERY_LEVEL(template <typename T>
               void nms(const T* boxes, const T* scores, const int32_t* categories,
                        int64_t batch, int64_t n, const NmsParams& params, int32_t* indices,
                        int32_t* num_valid);)

}  // namespace asickernels_cpu

namespace asickernels_cpu::ASICKERNELS_CPU_ISA {
namespace {

// Kept boxes are checked in chunks of this many lanes, one vector of doubles on AVX-512.
constexpr int64_t kLanes = 8;
constexpr int64_t kMinBlock = 128;
// Images are spread over threads only when each task has at least this many boxes.
constexpr int64_t kParallelBoxes = 16384;

// Visiting keys: ascending key = descending score, then ascending index. Float scores fit
// with the index in 64 bits; double scores need 128.
template <typename T>
struct KeyOf;
template <>
struct KeyOf<float> {
  using type = uint64_t;
  static type make(float score, uint32_t index) {
    const float folded = score + 0.0f;  // -0.0 -> 0.0
    uint32_t bits;
    std::memcpy(&bits, &folded, sizeof(bits));
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // monotone in the value
    return (static_cast<uint64_t>(~bits) << 32) | index;
  }
};
template <>
struct KeyOf<double> {
  using type = unsigned __int128;
  static type make(double score, uint32_t index) {
    const double folded = score + 0.0;
    uint64_t bits;
    std::memcpy(&bits, &folded, sizeof(bits));
    bits = (bits & (uint64_t{1} << 63)) ? ~bits : (bits | (uint64_t{1} << 63));
    return (static_cast<unsigned __int128>(~bits) << 64) | index;
  }
};

template <typename Key>
uint32_t index_of(Key key) {
  return static_cast<uint32_t>(key & 0xffffffffu);
}

// Boxes as double planes, with their areas.
struct Planes {
  std::vector<double> x1, y1, x2, y2, area;
  std::vector<int32_t> category;

  void resize(size_t n) {
    for (auto* plane : {&x1, &y1, &x2, &y2, &area}) plane->resize(n);
    category.resize(n);
  }
};

template <typename Key>
struct Workspace {
  Planes boxes;  // by original index
  Planes kept;   // kept boxes in selection order, padded to a multiple of kLanes
  Planes swept;  // the pool's boxes in pool order, during a sweep
  std::vector<Key> pool;
  std::vector<uint8_t> alive;
};

// The reference's NMS IoU of one box against another, compared with the threshold.
inline bool above(double ax1, double ay1, double ax2, double ay2, double a_area, double bx1,
                  double by1, double bx2, double by2, double b_area, double threshold) {
  const double iw = std::min(ax2, bx2) - std::max(ax1, bx1);
  const double ih = std::min(ay2, by2) - std::max(ay1, by1);
  const double inter = (iw > 0.0 ? iw : 0.0) * (ih > 0.0 ? ih : 0.0);
  const double union_area = a_area + b_area - inter;
  const double iou = union_area > 0.0 ? inter / union_area : 0.0;
  return iou > threshold;
}

#ifdef __AVX512F__
// `above` for one box against kLanes kept boxes, the same operations in the same order
// (exact: no FMA), one AVX-512 vector of doubles; GCC left the portable loop scalar.
static_assert(kLanes == 8, "one __m512d per chunk");

inline __mmask8 above_chunk(__m512d x1, __m512d y1, __m512d x2, __m512d y2, __m512d area,
                            const Planes& kept, int64_t start, __m512d threshold) {
  const __m512d zero = _mm512_setzero_pd();
  const __m512d iw = _mm512_sub_pd(_mm512_min_pd(x2, _mm512_loadu_pd(&kept.x2[start])),
                                   _mm512_max_pd(x1, _mm512_loadu_pd(&kept.x1[start])));
  const __m512d ih = _mm512_sub_pd(_mm512_min_pd(y2, _mm512_loadu_pd(&kept.y2[start])),
                                   _mm512_max_pd(y1, _mm512_loadu_pd(&kept.y1[start])));
  const __m512d inter = _mm512_mul_pd(_mm512_max_pd(iw, zero), _mm512_max_pd(ih, zero));
  const __m512d union_area =
      _mm512_sub_pd(_mm512_add_pd(area, _mm512_loadu_pd(&kept.area[start])), inter);
  const __mmask8 positive = _mm512_cmp_pd_mask(union_area, zero, _CMP_GT_OQ);
  const __m512d iou = _mm512_maskz_div_pd(positive, inter, union_area);
  return _mm512_cmp_pd_mask(iou, threshold, _CMP_GT_OQ);
}
#endif

// Whether box `i` is suppressed by any of kept[from, to) (to - from a multiple of kLanes;
// the padding has zero boxes, which suppress nothing).
template <bool kCategories>
bool suppressed(const Planes& boxes, uint32_t i, const Planes& kept, int64_t from, int64_t to,
                double threshold) {
  const double x1 = boxes.x1[i], y1 = boxes.y1[i], x2 = boxes.x2[i], y2 = boxes.y2[i];
  const double area = boxes.area[i];
  const int32_t category = boxes.category[i];
#ifdef __AVX512F__
  const __m512d vx1 = _mm512_set1_pd(x1), vy1 = _mm512_set1_pd(y1);
  const __m512d vx2 = _mm512_set1_pd(x2), vy2 = _mm512_set1_pd(y2);
  const __m512d varea = _mm512_set1_pd(area), vthreshold = _mm512_set1_pd(threshold);
  const __m256i vcategory = _mm256_set1_epi32(category);
  for (int64_t start = from; start < to; start += kLanes) {
    __mmask8 same = 0xff;
    if (kCategories) {  // most chunks hold no box of the category: skip their divisions
      same = _mm256_cmpeq_epi32_mask(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&kept.category[start])),
          vcategory);
      if (!same) continue;
    }
    if (above_chunk(vx1, vy1, vx2, vy2, varea, kept, start, vthreshold) & same) return true;
  }
#else
  for (int64_t start = from; start < to; start += kLanes) {
    if (kCategories) {  // most chunks hold no box of the category: skip their divisions
      bool any_same = false;
      for (int64_t j = start; j < start + kLanes; ++j) any_same |= kept.category[j] == category;
      if (!any_same) continue;
    }
    bool any = false;
    for (int64_t j = start; j < start + kLanes; ++j) {
      const bool hit = above(x1, y1, x2, y2, area, kept.x1[j], kept.y1[j], kept.x2[j],
                             kept.y2[j], kept.area[j], threshold);
      any |= kCategories ? (hit && kept.category[j] == category) : hit;
    }
    if (any) return true;
  }
#endif
  return false;
}

void append_kept(Planes& kept, int64_t count, const Planes& boxes, uint32_t i) {
  if (count % kLanes == 0) {  // a new chunk of zero boxes (none left from an earlier image)
    const size_t used = static_cast<size_t>(count), size = used + kLanes;
    for (auto* plane : {&kept.x1, &kept.y1, &kept.x2, &kept.y2, &kept.area}) {
      plane->resize(used);
      plane->resize(size, 0.0);
    }
    kept.category.resize(used);
    kept.category.resize(size, 0);
  }
  kept.x1[count] = boxes.x1[i];
  kept.y1[count] = boxes.y1[i];
  kept.x2[count] = boxes.x2[i];
  kept.y2[count] = boxes.y2[i];
  kept.area[count] = boxes.area[i];
  kept.category[count] = boxes.category[i];
}

// Drops from pool[begin, end) the boxes suppressed by kept[from, to); returns the new end.
template <bool kCategories, typename Key>
size_t sweep(Workspace<Key>& ws, size_t begin, size_t end, int64_t from, int64_t to,
             double threshold) {
  const size_t count = end - begin;
  Planes& swept = ws.swept;
  swept.resize(count);
  ws.alive.assign(count, 1);
  for (size_t j = 0; j < count; ++j) {
    const uint32_t i = index_of(ws.pool[begin + j]);
    swept.x1[j] = ws.boxes.x1[i];
    swept.y1[j] = ws.boxes.y1[i];
    swept.x2[j] = ws.boxes.x2[i];
    swept.y2[j] = ws.boxes.y2[i];
    swept.area[j] = ws.boxes.area[i];
    swept.category[j] = ws.boxes.category[i];
  }
  const double* __restrict sx1 = swept.x1.data();
  const double* __restrict sy1 = swept.y1.data();
  const double* __restrict sx2 = swept.x2.data();
  const double* __restrict sy2 = swept.y2.data();
  const double* __restrict sarea = swept.area.data();
  const int32_t* __restrict scat = swept.category.data();
  uint8_t* __restrict alive = ws.alive.data();
  for (int64_t k = from; k < to; ++k) {
    const double kx1 = ws.kept.x1[k], ky1 = ws.kept.y1[k], kx2 = ws.kept.x2[k];
    const double ky2 = ws.kept.y2[k], karea = ws.kept.area[k];
    const int32_t kcat = ws.kept.category[k];
    for (size_t j = 0; j < count; ++j) {
      bool hit = above(sx1[j], sy1[j], sx2[j], sy2[j], sarea[j], kx1, ky1, kx2, ky2, karea,
                       threshold);
      if (kCategories) hit = hit && scat[j] == kcat;
      alive[j] = alive[j] & static_cast<uint8_t>(!hit);
    }
  }
  size_t out = begin;
  for (size_t j = 0; j < count; ++j) {
    if (alive[j]) ws.pool[out++] = ws.pool[begin + j];
  }
  return out;
}

template <bool kCategories, typename T>
int32_t nms_image(const T* boxes, const T* scores, const int32_t* categories, int64_t n,
                  const NmsParams& params, int32_t* indices,
                  Workspace<typename KeyOf<T>::type>& ws) {
  ws.boxes.resize(static_cast<size_t>(n));
  ws.pool.clear();
  for (int64_t i = 0; i < n; ++i) {
    double c[4];
    bool finite = true;
    for (int d = 0; d < 4; ++d) {
      c[d] = static_cast<double>(boxes[4 * i + d]);
      finite = finite && std::isfinite(c[d]);
    }
    if (!finite) c[0] = c[1] = c[2] = c[3] = 0.0;
    ws.boxes.x1[i] = c[0];
    ws.boxes.y1[i] = c[1];
    ws.boxes.x2[i] = c[2];
    ws.boxes.y2[i] = c[3];
    ws.boxes.area[i] = (c[2] - c[0]) * (c[3] - c[1]);
    ws.boxes.category[i] = kCategories ? categories[i] : 0;
    const double score = static_cast<double>(scores[i]);
    if (!std::isnan(score) && score >= params.score_threshold) {
      ws.pool.push_back(KeyOf<T>::make(scores[i], static_cast<uint32_t>(i)));
    }
  }
  const int64_t max_output = params.max_output_size;
  const double threshold = params.iou_threshold;
  int64_t kept = 0;        // boxes in ws.kept (finite boxes only)
  int64_t selected = 0;    // entries written to indices
  int64_t swept_upto = 0;  // the pool holds no box suppressed by kept[0, swept_upto)
  size_t begin = 0, end = ws.pool.size();
  while (begin < end && selected < max_output) {
    const size_t wanted = static_cast<size_t>(std::max(kMinBlock, 2 * (max_output - selected)));
    size_t block_end = end;
    if (end - begin > 2 * wanted) {
      block_end = begin + wanted;
      std::nth_element(ws.pool.begin() + begin, ws.pool.begin() + block_end,
                       ws.pool.begin() + end);
    }
    std::sort(ws.pool.begin() + begin, ws.pool.begin() + block_end);
    size_t dropped = 0;
    for (size_t p = begin; p < block_end && selected < max_output; ++p) {
      const uint32_t i = index_of(ws.pool[p]);
      const int64_t padded = (kept + kLanes - 1) / kLanes * kLanes;
      if (suppressed<kCategories>(ws.boxes, i, ws.kept, swept_upto / kLanes * kLanes, padded,
                                  threshold)) {
        ++dropped;
        continue;
      }
      indices[selected++] = static_cast<int32_t>(i);
      append_kept(ws.kept, kept++, ws.boxes, i);
    }
    const size_t visited = block_end - begin;
    begin = block_end;
    // Sweeping pays when the block was mostly suppressed: the rest likely is too.
    if (begin < end && selected < max_output && kept > swept_upto && 2 * dropped >= visited) {
      end = sweep<kCategories>(ws, begin, end, swept_upto, kept, threshold);
      swept_upto = kept;
    }
  }
  for (int64_t s = selected; s < max_output; ++s) indices[s] = -1;
  return static_cast<int32_t>(selected);
}

}  // namespace

template <typename T>
void nms(const T* boxes, const T* scores, const int32_t* categories, int64_t batch, int64_t n,
         const NmsParams& params, int32_t* indices, int32_t* num_valid) {
  using Key = typename KeyOf<T>::type;
  auto run = [&](int64_t b) {
    thread_local Workspace<Key> ws;
    const int32_t* image_categories = categories ? categories + b * n : nullptr;
    int32_t* image_indices = indices + b * params.max_output_size;
    num_valid[b] = image_categories
                       ? nms_image<true>(boxes + 4 * b * n, scores + b * n, image_categories, n,
                                         params, image_indices, ws)
                       : nms_image<false>(boxes + 4 * b * n, scores + b * n, nullptr, n, params,
                                          image_indices, ws);
  };
  if (batch > 1 && n >= kParallelBoxes) {
    parallel_for(batch, run);
  } else {
    for (int64_t b = 0; b < batch; ++b) run(b);
  }
}

template void nms<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                         const NmsParams&, int32_t*, int32_t*);
template void nms<double>(const double*, const double*, const int32_t*, int64_t, int64_t,
                          const NmsParams&, int32_t*, int32_t*);

}  // namespace asickernels_cpu::ASICKERNELS_CPU_ISA

#ifdef ASICKERNELS_CPU_ENTRY_POINTS
AK_ATTRIBUTES(asickernels_cpu::NmsParams, iou_threshold, max_output_size, score_threshold);

namespace asickernels_cpu::entry {
namespace {

template <typename T>
void nms(const T* boxes, const T* scores, const int32_t* categories, int64_t batch, int64_t n,
         const NmsParams& params, int32_t* indices, int32_t* num_valid) {
  AK_DISPATCH(nms(boxes, scores, categories, batch, n, params, indices, num_valid));
}

// boxes [..., N, 4], scores [..., N] and categories [..., N] or null (leading dimensions are
// images) -> indices [..., max_output_size], num_valid [...].
template <ffi::DataType kType>
ffi::Error run_nms(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores,
                   const int32_t* categories, const NmsParams& params,
                   ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> num_valid) {
  const auto dims = scores.dimensions();
  if (dims.size() == 0 || params.max_output_size < 0) {
    return ffi::Error::InvalidArgument("nms: scores [..., N] and max_output_size >= 0 expected");
  }
  const int64_t n = dims.back();
  int64_t batch = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) batch *= dims[i];
  if (boxes.element_count() != scores.element_count() * 4 ||
      indices->element_count() != static_cast<size_t>(batch * params.max_output_size) ||
      num_valid->element_count() != static_cast<size_t>(batch)) {
    return ffi::Error::InvalidArgument("nms: boxes, indices or num_valid of the wrong size");
  }
  return ffi_guarded([&] {
    nms<Native<kType>>(boxes.typed_data(), scores.typed_data(), categories, batch, n,
                       params, indices->typed_data(), num_valid->typed_data());
  });
}

template <ffi::DataType kType>
ffi::Error Nms(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores, NmsParams params,
               ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> num_valid) {
  return run_nms(boxes, scores, nullptr, params, indices, num_valid);
}

// categories [..., N] int32: a box suppresses only boxes of its category.
template <ffi::DataType kType>
ffi::Error BatchedNms(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores,
                      ffi::Buffer<ffi::S32> categories, NmsParams params,
                      ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> num_valid) {
  if (categories.element_count() != scores.element_count()) {
    return ffi::Error::InvalidArgument("batched_nms: categories must have the shape of scores");
  }
  return run_nms(boxes, scores, categories.typed_data(), params, indices, num_valid);
}

}  // namespace

AK_FLOAT_HANDLER(nms, Nms)
AK_FLOAT_HANDLER(batched_nms, BatchedNms)

}  // namespace asickernels_cpu::entry
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
