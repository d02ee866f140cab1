// Box-pair metrics (IoU, GIOU, DIoU, CIoU) and their gradients in T (float or double), on
// paired boxes ([P, 4] x2 -> [P]) and on every pair of two sets ([B, N, 4] x [B, M, 4] ->
// [B, N, M]). Formulas and gradient rules are the float64 references' (asickernels/kernels/
// giou.py and box_iou.py): eps = 1e-7 in every denominator; max/min pass the gradient to the
// boxes1 side on a tie, max(0, w) only where w > 0; CIoU's alpha is a constant for gradients
// (as torchvision and the CIoU paper have it).
// One per-pair function computes each metric and one its gradient: the kernels differ only
// in how they walk the pairs.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "csrc/kernels.h"

namespace asickernels_cpu {

// Box-pair metrics (asickernels/kernels/box_iou.py's METRICS).
enum class BoxMetric { kIou, kGiou, kDiou, kCiou };

AK_EVERY_LEVEL(
    // metric [P] of paired boxes [P, 4].
    template <typename T>
    void paired_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t pairs,
                           T* out);

    // Gradient of sum(cotangent * metric) with respect to boxes1 and boxes2 ([P, 4] each),
    // CIoU's alpha held constant; d_boxes2 may be nullptr when only boxes1's is wanted.
    template <typename T>
    void paired_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                               const T* cotangent, int64_t pairs, T* d_boxes1, T* d_boxes2);

    // metric [B, N, M] of every pair of boxes1 [B, N, 4] and boxes2 [B, M, 4].
    template <typename T>
    void pairwise_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2,
                             int64_t batch, int64_t n, int64_t m, T* out);

    // Gradient of sum(cotangent [B, N, M] * metric) with respect to boxes1 and boxes2.
    template <typename T>
    void pairwise_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                                 const T* cotangent, int64_t batch, int64_t n, int64_t m,
                                 T* d_boxes1, T* d_boxes2);)

}  // namespace asickernels_cpu

namespace asickernels_cpu::ASICKERNELS_CPU_ISA {
namespace {

// The per-pair functions must be inlined into the loops for those to vectorize; GCC's own
// heuristics leave DIoU's and CIoU's out of line (several times slower).
#define AK_PER_PAIR __attribute__((always_inline)) inline

constexpr double kEps = 1e-7;  // reference.GIOU_EPS
constexpr double kPi = 3.14159265358979323846;
constexpr double kFourOverPiSquared = 4.0 / (kPi * kPi);
// Pairs per parallel task; below two tasks' worth a call stays on one thread, since a thread
// wake-up costs more than the work.
constexpr int64_t kPairsPerTask = 32768;

template <typename T>
AK_PER_PAIR T arctan(T z) {
  return std::atan(z);
}

// float: Cephes' atanf (range reduction to |x| <= tan(pi / 8), then an odd polynomial;
// absolute error 1.4e-7, as the XLA backend's), which vectorizes where atanf is a scalar call.
template <>
AK_PER_PAIR float arctan(float z) {
  const float a = std::fabs(z);
  const bool big = a > 2.414213562373095f;   // tan(3 pi / 8)
  const bool mid = a > 0.4142135623730950f;  // tan(pi / 8)
  const float x = big ? -1.0f / a : (mid ? (a - 1.0f) / (a + 1.0f) : a);
  const float offset = big ? static_cast<float>(kPi / 2) : (mid ? static_cast<float>(kPi / 4) : 0.0f);
  const float s = x * x;
  const float poly =
      ((8.05374449538e-2f * s - 1.38776856032e-1f) * s + 1.99777106478e-1f) * s - 3.33329491539e-1f;
  return std::copysign(offset + poly * s * x + x, z);
}

// The forward quantities of one box pair (x1, y1, x2, y2) against (u1, v1, u2, v2) that the
// metric and its gradient share; fields a metric does not use stay 0.
template <typename T>
struct PairTerms {
  T w1, h1, w2, h2;
  // Which box each edge of the intersection and of the hull comes from (true: boxes1).
  bool left_1, right_1, top_1, bottom_1;
  bool hull_left_1, hull_right_1, hull_top_1, hull_bottom_1;
  T iw, ih, iw_c, ih_c, inter, union_area, union_e, iou;
  T cw, ch, hull_e;                       // hull width and height; GIOU's hull area + eps
  T dx, dy, rho2, diag_e;                 // DIoU: centre offset, its square, hull diagonal^2 + eps
  T h1_e, h2_e, r1, r2, angle, v, alpha;  // CIoU's aspect term
  T value;
};

template <BoxMetric kMetric, typename T>
AK_PER_PAIR PairTerms<T> pair_terms(T x1, T y1, T x2, T y2, T u1, T v1, T u2, T v2) {
  const T eps = static_cast<T>(kEps);
  PairTerms<T> t{};
  t.w1 = x2 - x1, t.h1 = y2 - y1, t.w2 = u2 - u1, t.h2 = v2 - v1;
  t.left_1 = x1 >= u1, t.right_1 = x2 <= u2, t.top_1 = y1 >= v1, t.bottom_1 = y2 <= v2;
  t.iw = (t.right_1 ? x2 : u2) - (t.left_1 ? x1 : u1);
  t.ih = (t.bottom_1 ? y2 : v2) - (t.top_1 ? y1 : v1);
  t.iw_c = t.iw > 0 ? t.iw : T(0);
  t.ih_c = t.ih > 0 ? t.ih : T(0);
  t.inter = t.iw_c * t.ih_c;
  t.union_area = t.w1 * t.h1 + t.w2 * t.h2 - t.inter;
  t.union_e = t.union_area + eps;
  t.iou = t.inter / t.union_e;
  t.value = t.iou;
  if constexpr (kMetric == BoxMetric::kIou) return t;
  t.hull_left_1 = x1 <= u1, t.hull_right_1 = x2 >= u2;
  t.hull_top_1 = y1 <= v1, t.hull_bottom_1 = y2 >= v2;
  t.cw = (t.hull_right_1 ? x2 : u2) - (t.hull_left_1 ? x1 : u1);
  t.ch = (t.hull_bottom_1 ? y2 : v2) - (t.hull_top_1 ? y1 : v1);
  if constexpr (kMetric == BoxMetric::kGiou) {
    const T hull = t.cw * t.ch;
    t.hull_e = hull + eps;
    t.value = t.iou - (hull - t.union_area) / t.hull_e;
    return t;
  }
  t.dx = (x1 + x2 - u1 - u2) * T(0.5);
  t.dy = (y1 + y2 - v1 - v2) * T(0.5);
  t.rho2 = t.dx * t.dx + t.dy * t.dy;
  t.diag_e = t.cw * t.cw + t.ch * t.ch + eps;
  t.value = t.iou - t.rho2 / t.diag_e;
  if constexpr (kMetric == BoxMetric::kCiou) {
    t.h1_e = t.h1 + eps, t.h2_e = t.h2 + eps;
    t.r1 = t.w1 / t.h1_e, t.r2 = t.w2 / t.h2_e;
    t.angle = arctan(t.r2) - arctan(t.r1);
    t.v = t.angle * t.angle * static_cast<T>(kFourOverPiSquared);
    t.alpha = t.v / (T(1) - t.iou + t.v + eps);
    t.value = t.value - t.v * t.alpha;
  }
  return t;
}

template <typename T>
struct PairGradient {
  T x1, y1, x2, y2, u1, v1, u2, v2;
};

// The gradient of g * metric with respect to the pair's eight coordinates.
template <BoxMetric kMetric, typename T>
AK_PER_PAIR PairGradient<T> pair_gradient(const PairTerms<T>& t, T g) {
  const T inv_union = T(1) / t.union_e;
  T d_union = -g * t.inter * inv_union * inv_union;
  T d_cw = 0, d_ch = 0, d_dx = 0, d_dy = 0, d_w1 = 0, d_h1 = 0, d_w2 = 0, d_h2 = 0;
  if constexpr (kMetric == BoxMetric::kGiou) {
    const T inv_hull = T(1) / t.hull_e;
    d_union += g * inv_hull;
    const T d_hull = -g * t.union_e * inv_hull * inv_hull;
    d_cw = d_hull * t.ch, d_ch = d_hull * t.cw;
  }
  if constexpr (kMetric == BoxMetric::kDiou || kMetric == BoxMetric::kCiou) {
    const T inv_diag = T(1) / t.diag_e;
    const T d_diag = g * t.rho2 * inv_diag * inv_diag;
    d_cw = T(2) * d_diag * t.cw, d_ch = T(2) * d_diag * t.ch;
    // rho2 = dx^2 + dy^2 with dx = (x1 + x2 - u1 - u2) / 2: d rho2 / d x1 = dx.
    d_dx = -g * inv_diag * t.dx, d_dy = -g * inv_diag * t.dy;
  }
  if constexpr (kMetric == BoxMetric::kCiou) {  // alpha constant: only v carries a gradient
    const T d_angle = -g * t.alpha * static_cast<T>(2 * kFourOverPiSquared) * t.angle;
    const T d_r2 = d_angle / (T(1) + t.r2 * t.r2), d_r1 = -d_angle / (T(1) + t.r1 * t.r1);
    d_w1 = d_r1 / t.h1_e, d_h1 = -d_r1 * t.r1 / t.h1_e;
    d_w2 = d_r2 / t.h2_e, d_h2 = -d_r2 * t.r2 / t.h2_e;
  }
  const T d_inter = g * inv_union - d_union;  // the union subtracts the intersection
  d_w1 += d_union * t.h1, d_h1 += d_union * t.w1;
  d_w2 += d_union * t.h2, d_h2 += d_union * t.w2;
  const T d_iw = t.iw > 0 ? d_inter * t.ih_c : T(0);
  const T d_ih = t.ih > 0 ? d_inter * t.iw_c : T(0);
  // Widths and centres enter both boxes; intersection and hull edges go to the side the
  // max/min took.
  PairGradient<T> d;
  d.x1 = -d_w1 + d_dx - (t.left_1 ? d_iw : T(0)) - (t.hull_left_1 ? d_cw : T(0));
  d.y1 = -d_h1 + d_dy - (t.top_1 ? d_ih : T(0)) - (t.hull_top_1 ? d_ch : T(0));
  d.x2 = d_w1 + d_dx + (t.right_1 ? d_iw : T(0)) + (t.hull_right_1 ? d_cw : T(0));
  d.y2 = d_h1 + d_dy + (t.bottom_1 ? d_ih : T(0)) + (t.hull_bottom_1 ? d_ch : T(0));
  d.u1 = -d_w2 - d_dx - (t.left_1 ? T(0) : d_iw) - (t.hull_left_1 ? T(0) : d_cw);
  d.v1 = -d_h2 - d_dy - (t.top_1 ? T(0) : d_ih) - (t.hull_top_1 ? T(0) : d_ch);
  d.u2 = d_w2 - d_dx + (t.right_1 ? T(0) : d_iw) + (t.hull_right_1 ? T(0) : d_cw);
  d.v2 = d_h2 - d_dy + (t.bottom_1 ? T(0) : d_ih) + (t.hull_bottom_1 ? T(0) : d_ch);
  return d;
}

// Calls body(std::integral_constant<BoxMetric, metric>) so that each metric compiles its own
// loops.
template <typename Body>
void with_metric(BoxMetric metric, const Body& body) {
  switch (metric) {
    case BoxMetric::kIou:
      return body(std::integral_constant<BoxMetric, BoxMetric::kIou>{});
    case BoxMetric::kGiou:
      return body(std::integral_constant<BoxMetric, BoxMetric::kGiou>{});
    case BoxMetric::kDiou:
      return body(std::integral_constant<BoxMetric, BoxMetric::kDiou>{});
    case BoxMetric::kCiou:
      return body(std::integral_constant<BoxMetric, BoxMetric::kCiou>{});
  }
}

// Runs task(i) for i in [0, tasks) on the pool when the call has 2+ tasks' worth of pairs.
template <typename Task>
void run_tasks(int64_t tasks, int64_t pairs, const Task& task) {
  if (pairs < 2 * kPairsPerTask) {
    for (int64_t i = 0; i < tasks; ++i) task(i);
  } else {
    parallel_for(tasks, task);
  }
}

// -- paired --------------------------------------------------------------------------------

template <BoxMetric kMetric, typename T>
void paired_range(const T* __restrict b1, const T* __restrict b2, int64_t begin, int64_t end,
                  T* __restrict out) {
#pragma GCC ivdep
  for (int64_t p = begin; p < end; ++p) {
    out[p] = pair_terms<kMetric>(b1[4 * p], b1[4 * p + 1], b1[4 * p + 2], b1[4 * p + 3],
                                 b2[4 * p], b2[4 * p + 1], b2[4 * p + 2], b2[4 * p + 3])
                 .value;
  }
}

// Boxes [P, 4] are interleaved; the gradient's eight strided output streams keep the compiler
// from vectorizing well, so tiles are split into coordinate planes, computed plane by plane,
// and interleaved back.
constexpr int64_t kTile = 256;
// Planes are kStride apart, not a multiple of 4 KB: loads and stores whose addresses agree in
// the low 12 bits falsely wait on each other (4K aliasing), which made GIOU's gradient
// several times slower.
constexpr int64_t kStride = kTile + 16;

template <typename T>
struct Tile {
  alignas(64) T in[9][kStride];  // x1, y1, x2, y2, u1, v1, u2, v2, cotangent
  alignas(64) T d[8][kStride];
};

template <BoxMetric kMetric, typename T>
void paired_vjp_tile(Tile<T>& tile, int64_t count) {
  const T* __restrict in = &tile.in[0][0];
  T* __restrict d = &tile.d[0][0];
#pragma GCC ivdep
  for (int64_t p = 0; p < count; ++p) {
    const PairTerms<T> t = pair_terms<kMetric>(
        in[0 * kStride + p], in[1 * kStride + p], in[2 * kStride + p], in[3 * kStride + p],
        in[4 * kStride + p], in[5 * kStride + p], in[6 * kStride + p], in[7 * kStride + p]);
    const PairGradient<T> g = pair_gradient<kMetric>(t, in[8 * kStride + p]);
    d[0 * kStride + p] = g.x1, d[1 * kStride + p] = g.y1;
    d[2 * kStride + p] = g.x2, d[3 * kStride + p] = g.y2;
    d[4 * kStride + p] = g.u1, d[5 * kStride + p] = g.v1;
    d[6 * kStride + p] = g.u2, d[7 * kStride + p] = g.v2;
  }
}

template <BoxMetric kMetric, typename T>
void paired_vjp_range(const T* __restrict b1, const T* __restrict b2, const T* __restrict g_in,
                      int64_t begin, int64_t end, T* __restrict d1, T* __restrict d2) {
  Tile<T> tile;
  for (int64_t start = begin; start < end; start += kTile) {
    const int64_t count = std::min(kTile, end - start);
    for (int64_t p = 0; p < count; ++p) {
      for (int c = 0; c < 4; ++c) {
        tile.in[c][p] = b1[4 * (start + p) + c];
        tile.in[4 + c][p] = b2[4 * (start + p) + c];
      }
      tile.in[8][p] = g_in[start + p];
    }
    paired_vjp_tile<kMetric>(tile, count);
    for (int64_t p = 0; p < count; ++p) {
      for (int c = 0; c < 4; ++c) d1[4 * (start + p) + c] = tile.d[c][p];
    }
    if (d2 == nullptr) continue;  // only boxes1's gradient wanted: half the output traffic
    for (int64_t p = 0; p < count; ++p) {
      for (int c = 0; c < 4; ++c) d2[4 * (start + p) + c] = tile.d[4 + c][p];
    }
  }
}

// Runs body(begin, end) over blocks of kPairsPerTask pairs.
template <typename Body>
void for_pair_blocks(int64_t pairs, const Body& body) {
  const int64_t tasks = (pairs + kPairsPerTask - 1) / kPairsPerTask;
  run_tasks(tasks, pairs, [&](int64_t task) {
    const int64_t begin = task * kPairsPerTask;
    body(begin, std::min(pairs, begin + kPairsPerTask));
  });
}

// -- pairwise ------------------------------------------------------------------------------

// boxes [count, 4] as four coordinate planes [4][count]: the inner loops run over boxes2,
// whose coordinates are then contiguous.
template <typename T>
std::vector<T> coordinate_planes(const T* boxes, int64_t count) {
  std::vector<T> planes(static_cast<size_t>(4 * count));
  for (int64_t i = 0; i < count; ++i) {
    for (int c = 0; c < 4; ++c) planes[c * count + i] = boxes[4 * i + c];
  }
  return planes;
}

// How each image's N rows are split into tasks: chunks of about kPairsPerTask pairs, at most
// max_chunks per image.
struct RowChunks {
  int64_t per_image, rows;

  RowChunks(int64_t n, int64_t m, int64_t max_chunks) {
    const int64_t wanted = std::max<int64_t>(1, n * m / kPairsPerTask);
    per_image = std::max<int64_t>(1, std::min({wanted, max_chunks, n}));
    rows = (n + per_image - 1) / per_image;
  }
};

// body(image, row_begin, row_end, task) over every chunk of every image.
template <typename Body>
void for_row_chunks(int64_t batch, int64_t n, int64_t m, const RowChunks& chunks,
                    const Body& body) {
  run_tasks(batch * chunks.per_image, batch * n * m, [&](int64_t task) {
    const int64_t image = task / chunks.per_image;
    const int64_t begin = (task % chunks.per_image) * chunks.rows;
    body(image, std::min(n, begin), std::min(n, begin + chunks.rows), task);
  });
}

template <BoxMetric kMetric, typename T>
void pairwise_metric(const T* boxes1, const T* boxes2, int64_t batch, int64_t n, int64_t m,
                     T* out) {
  const std::vector<T> columns = coordinate_planes(boxes2, batch * m);
  const int64_t plane = batch * m;
  const RowChunks chunks(n, m, n);
  for_row_chunks(batch, n, m, chunks, [&](int64_t image, int64_t begin, int64_t end, int64_t) {
    const T* __restrict u1 = columns.data() + image * m;
    const T* __restrict v1 = u1 + plane;
    const T* __restrict u2 = v1 + plane;
    const T* __restrict v2 = u2 + plane;
    for (int64_t row = image * n + begin; row < image * n + end; ++row) {
      const T* box = boxes1 + 4 * row;
      const T x1 = box[0], y1 = box[1], x2 = box[2], y2 = box[3];
      T* __restrict out_row = out + row * m;
#pragma GCC ivdep
      for (int64_t j = 0; j < m; ++j) {
        out_row[j] = pair_terms<kMetric>(x1, y1, x2, y2, u1[j], v1[j], u2[j], v2[j]).value;
      }
    }
  });
}

// Partial sums of boxes2's gradient per task; a fixed number per image (not per thread),
// so that the summation order, hence the result, does not depend on the thread count.
constexpr int64_t kMaxVjpChunks = 8;
// Lanes of the row sums of boxes1's gradient (floating-point sums are not reassociated by the
// compiler, so the vector lanes are spelled out).
constexpr int64_t kLanes = 16;

template <BoxMetric kMetric, typename T>
void pairwise_metric_vjp(const T* boxes1, const T* boxes2, const T* cotangent, int64_t batch,
                         int64_t n, int64_t m, T* d_boxes1, T* d_boxes2) {
  const std::vector<T> columns = coordinate_planes(boxes2, batch * m);
  const int64_t plane = batch * m;
  const RowChunks chunks(n, m, kMaxVjpChunks);
  std::vector<T> partial(static_cast<size_t>(batch * chunks.per_image * 4 * m), T(0));
  for_row_chunks(batch, n, m, chunks, [&](int64_t image, int64_t begin, int64_t end,
                                          int64_t task) {
    const T* __restrict u1 = columns.data() + image * m;
    const T* __restrict v1 = u1 + plane;
    const T* __restrict u2 = v1 + plane;
    const T* __restrict v2 = u2 + plane;
    T* __restrict d2 = partial.data() + task * 4 * m;  // planes du1, dv1, du2, dv2
    for (int64_t row = image * n + begin; row < image * n + end; ++row) {
      const T* box = boxes1 + 4 * row;
      const T x1 = box[0], y1 = box[1], x2 = box[2], y2 = box[3];
      const T* __restrict g = cotangent + row * m;
      T sums[4][kLanes] = {};
      const auto pair = [&](int64_t j, int64_t lane) {
        const PairGradient<T> d = pair_gradient<kMetric>(
            pair_terms<kMetric>(x1, y1, x2, y2, u1[j], v1[j], u2[j], v2[j]), g[j]);
        sums[0][lane] += d.x1, sums[1][lane] += d.y1;
        sums[2][lane] += d.x2, sums[3][lane] += d.y2;
        d2[j] += d.u1, d2[m + j] += d.v1, d2[2 * m + j] += d.u2, d2[3 * m + j] += d.v2;
      };
      int64_t j = 0;
      for (; j + kLanes <= m; j += kLanes) {
#pragma GCC ivdep
        for (int64_t lane = 0; lane < kLanes; ++lane) pair(j + lane, lane);
      }
      for (; j < m; ++j) pair(j, 0);
      for (int c = 0; c < 4; ++c) {
        T total = 0;
        for (int64_t lane = 0; lane < kLanes; ++lane) total += sums[c][lane];
        d_boxes1[4 * row + c] = total;
      }
    }
  });
  for (int64_t image = 0; image < batch; ++image) {
    const T* image_partial = partial.data() + image * chunks.per_image * 4 * m;
    for (int64_t j = 0; j < m; ++j) {
      for (int c = 0; c < 4; ++c) {
        T total = 0;
        for (int64_t k = 0; k < chunks.per_image; ++k) total += image_partial[(4 * k + c) * m + j];
        d_boxes2[4 * (image * m + j) + c] = total;
      }
    }
  }
}

}  // namespace

template <typename T>
void paired_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t pairs,
                       T* out) {
  with_metric(metric, [&](auto kind) {
    for_pair_blocks(pairs, [&](int64_t begin, int64_t end) {
      paired_range<decltype(kind)::value>(boxes1, boxes2, begin, end, out);
    });
  });
}

template <typename T>
void paired_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                           const T* cotangent, int64_t pairs, T* d_boxes1, T* d_boxes2) {
  with_metric(metric, [&](auto kind) {
    for_pair_blocks(pairs, [&](int64_t begin, int64_t end) {
      paired_vjp_range<decltype(kind)::value>(boxes1, boxes2, cotangent, begin, end, d_boxes1,
                                              d_boxes2);
    });
  });
}

template <typename T>
void pairwise_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t batch,
                         int64_t n, int64_t m, T* out) {
  with_metric(metric, [&](auto kind) {
    pairwise_metric<decltype(kind)::value>(boxes1, boxes2, batch, n, m, out);
  });
}

template <typename T>
void pairwise_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                             const T* cotangent, int64_t batch, int64_t n, int64_t m,
                             T* d_boxes1, T* d_boxes2) {
  with_metric(metric, [&](auto kind) {
    pairwise_metric_vjp<decltype(kind)::value>(boxes1, boxes2, cotangent, batch, n, m, d_boxes1,
                                               d_boxes2);
  });
}

#define AK_BOX_METRICS(T)                                                                      \
  template void paired_box_metric<T>(BoxMetric, const T*, const T*, int64_t, T*);              \
  template void paired_box_metric_vjp<T>(BoxMetric, const T*, const T*, const T*, int64_t, T*, \
                                         T*);                                                  \
  template void pairwise_box_metric<T>(BoxMetric, const T*, const T*, int64_t, int64_t,        \
                                       int64_t, T*);                                           \
  template void pairwise_box_metric_vjp<T>(BoxMetric, const T*, const T*, const T*, int64_t,   \
                                           int64_t, int64_t, T*, T*);
AK_BOX_METRICS(float)
AK_BOX_METRICS(double)

}  // namespace asickernels_cpu::ASICKERNELS_CPU_ISA

#ifdef ASICKERNELS_CPU_ENTRY_POINTS
namespace asickernels_cpu::entry {

// The handlers' attributes: the metric by name ("iou", "giou", "diou" or "ciou").
struct MetricAttribute {
  std::string_view metric;
};

}  // namespace asickernels_cpu::entry

AK_ATTRIBUTES(asickernels_cpu::entry::MetricAttribute, metric);

namespace asickernels_cpu::entry {
namespace {

template <typename T>
void paired_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t pairs,
                       T* out) {
  AK_DISPATCH(paired_box_metric(metric, boxes1, boxes2, pairs, out));
}

template <typename T>
void paired_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                           const T* cotangent, int64_t pairs, T* d_boxes1, T* d_boxes2) {
  AK_DISPATCH(paired_box_metric_vjp(metric, boxes1, boxes2, cotangent, pairs, d_boxes1,
                                    d_boxes2));
}

template <typename T>
void pairwise_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t batch,
                         int64_t n, int64_t m, T* out) {
  AK_DISPATCH(pairwise_box_metric(metric, boxes1, boxes2, batch, n, m, out));
}

template <typename T>
void pairwise_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                             const T* cotangent, int64_t batch, int64_t n, int64_t m,
                             T* d_boxes1, T* d_boxes2) {
  AK_DISPATCH(pairwise_box_metric_vjp(metric, boxes1, boxes2, cotangent, batch, n, m, d_boxes1,
                                      d_boxes2));
}

// Leading dimensions beyond the kernel's own are batch dimensions (what vmap's
// "broadcast_all" adds): paired metrics flatten them into pairs, pairwise ones into images.

// The metric the attribute names, or an error.
ffi::Error box_metric(MetricAttribute attribute, BoxMetric& metric) {
  static constexpr std::pair<std::string_view, BoxMetric> kNames[] = {
      {"iou", BoxMetric::kIou},
      {"giou", BoxMetric::kGiou},
      {"diou", BoxMetric::kDiou},
      {"ciou", BoxMetric::kCiou},
  };
  for (const auto& [name, value] : kNames) {
    if (attribute.metric == name) {
      metric = value;
      return ffi::Error::Success();
    }
  }
  return ffi::Error::InvalidArgument("box metric: iou, giou, diou or ciou expected, got " +
                                     std::string(attribute.metric));
}

// Paired boxes [..., 4] x2 -> [...]: leading dimensions are pairs.
template <ffi::DataType kType>
ffi::Error PairedBoxMetric(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                           MetricAttribute attribute, ffi::ResultBuffer<kType> out) {
  BoxMetric metric;
  if (ffi::Error error = box_metric(attribute, metric); error.failure()) return error;
  const size_t pairs = boxes1.element_count() / 4;
  if (boxes2.element_count() != pairs * 4 || out->element_count() != pairs) {
    return ffi::Error::InvalidArgument("paired box metric: boxes [..., 4] x2 -> [...]");
  }
  return ffi_guarded([&] {
    paired_box_metric<Native<kType>>(metric, boxes1.typed_data(), boxes2.typed_data(),
                                     static_cast<int64_t>(pairs), out->typed_data());
  });
}

// The gradients of both boxes, or of boxes1 alone when d_boxes2 is null.
template <ffi::DataType kType>
ffi::Error run_paired_vjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                          ffi::Buffer<kType> cotangent, MetricAttribute attribute,
                          ffi::Buffer<kType> d_boxes1, Native<kType>* d_boxes2,
                          size_t d_boxes2_count) {
  BoxMetric metric;
  if (ffi::Error error = box_metric(attribute, metric); error.failure()) return error;
  const size_t pairs = boxes1.element_count() / 4;
  if (boxes2.element_count() != pairs * 4 || cotangent.element_count() != pairs ||
      d_boxes1.element_count() != pairs * 4 || (d_boxes2 && d_boxes2_count != pairs * 4)) {
    return ffi::Error::InvalidArgument(
        "paired box metric gradient: boxes [..., 4] x2, cotangent [...] -> [..., 4]");
  }
  return ffi_guarded([&] {
    paired_box_metric_vjp<Native<kType>>(metric, boxes1.typed_data(), boxes2.typed_data(),
                                         cotangent.typed_data(), static_cast<int64_t>(pairs),
                                         d_boxes1.typed_data(), d_boxes2);
  });
}

template <ffi::DataType kType>
ffi::Error PairedBoxMetricVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                              ffi::Buffer<kType> cotangent, MetricAttribute attribute,
                              ffi::ResultBuffer<kType> d_boxes1,
                              ffi::ResultBuffer<kType> d_boxes2) {
  return run_paired_vjp(boxes1, boxes2, cotangent, attribute, *d_boxes1,
                        d_boxes2->typed_data(), d_boxes2->element_count());
}

// The gradient with respect to boxes1 only (boxes2 is not differentiated, e.g. targets).
template <ffi::DataType kType>
ffi::Error PairedBoxMetricVjpFirst(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                                   ffi::Buffer<kType> cotangent, MetricAttribute attribute,
                                   ffi::ResultBuffer<kType> d_boxes1) {
  return run_paired_vjp(boxes1, boxes2, cotangent, attribute, *d_boxes1, nullptr, 0);
}

// Pairwise boxes1 [..., N, 4] x boxes2 [..., M, 4]: leading dimensions are images. Runs
// run(metric, batch, n, m) under ffi_guarded once `out` (the metric, or a cotangent) is
// [..., N, M], or returns the error of the metric or of a shape.
template <ffi::DataType kType, typename Run>
ffi::Error run_pairwise(MetricAttribute attribute, const ffi::Buffer<kType>& boxes1,
                        const ffi::Buffer<kType>& boxes2, const ffi::Buffer<kType>& out,
                        Run&& run) {
  BoxMetric metric;
  if (ffi::Error error = box_metric(attribute, metric); error.failure()) return error;
  const auto dims1 = boxes1.dimensions(), dims2 = boxes2.dimensions();
  if (dims1.size() < 2 || dims1.size() != dims2.size() || dims1.back() != 4 ||
      dims2.back() != 4) {
    return ffi::Error::InvalidArgument("pairwise box metric: boxes [..., N, 4], [..., M, 4]");
  }
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < dims1.size(); ++i) batch *= dims1[i];
  const int64_t n = dims1[dims1.size() - 2], m = dims2[dims2.size() - 2];
  if (static_cast<int64_t>(boxes2.element_count()) != batch * m * 4 ||
      static_cast<int64_t>(out.element_count()) != batch * n * m) {
    return ffi::Error::InvalidArgument(
        "pairwise box metric: [..., N, 4] x [..., M, 4] -> [..., N, M]");
  }
  return ffi_guarded([&] { run(metric, batch, n, m); });
}

template <ffi::DataType kType>
ffi::Error PairwiseBoxMetric(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                             MetricAttribute attribute, ffi::ResultBuffer<kType> out) {
  return run_pairwise(attribute, boxes1, boxes2, *out,
                      [&](BoxMetric metric, int64_t batch, int64_t n, int64_t m) {
                        pairwise_box_metric<Native<kType>>(metric, boxes1.typed_data(),
                                                           boxes2.typed_data(), batch, n, m,
                                                           out->typed_data());
                      });
}

template <ffi::DataType kType>
ffi::Error PairwiseBoxMetricVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                                ffi::Buffer<kType> cotangent, MetricAttribute attribute,
                                ffi::ResultBuffer<kType> d_boxes1,
                                ffi::ResultBuffer<kType> d_boxes2) {
  if (d_boxes1->element_count() != boxes1.element_count() ||
      d_boxes2->element_count() != boxes2.element_count()) {
    return ffi::Error::InvalidArgument(
        "pairwise box metric gradient: d_boxes of the boxes' shapes");
  }
  return run_pairwise(
      attribute, boxes1, boxes2, cotangent,
      [&](BoxMetric metric, int64_t batch, int64_t n, int64_t m) {
        pairwise_box_metric_vjp<Native<kType>>(metric, boxes1.typed_data(), boxes2.typed_data(),
                                               cotangent.typed_data(), batch, n, m,
                                               d_boxes1->typed_data(), d_boxes2->typed_data());
      });
}

}  // namespace

AK_FLOAT_HANDLER(paired_box_metric, PairedBoxMetric)
AK_FLOAT_HANDLER(paired_box_metric_vjp, PairedBoxMetricVjp)
AK_FLOAT_HANDLER(paired_box_metric_vjp_first, PairedBoxMetricVjpFirst)
AK_FLOAT_HANDLER(pairwise_box_metric, PairwiseBoxMetric)
AK_FLOAT_HANDLER(pairwise_box_metric_vjp, PairwiseBoxMetricVjp)

}  // namespace asickernels_cpu::entry
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
