// GIOU forward and backward over paired boxes [P, 4], elementwise in T (float or double).
// The formulas and the tie rule of the gradient are asickernels/reference.py's: max/min
// pass the gradient to the boxes1 side on a tie, max(0, w) only where w > 0.
#include <algorithm>

#include "kernels.h"

namespace asickernels_cpu {
namespace {

constexpr double kEps = 1e-7;  // reference.GIOU_EPS
// Pairs per parallel task; below two tasks' worth the call stays on one thread, since a
// thread wake-up costs more than the work.
constexpr int64_t kPairsPerTask = 32768;

template <typename Body>
void for_pair_blocks(int64_t pairs, const Body& body) {
  const int64_t tasks = (pairs + kPairsPerTask - 1) / kPairsPerTask;
  if (tasks < 2) {
    body(int64_t{0}, pairs);
    return;
  }
  parallel_for(tasks, [&](int64_t task) {
    const int64_t begin = task * kPairsPerTask;
    body(begin, std::min(pairs, begin + kPairsPerTask));
  });
}

template <typename T>
void giou_range(const T* __restrict b1, const T* __restrict b2, int64_t begin, int64_t end,
                T* __restrict out) {
  const T eps = static_cast<T>(kEps);
#pragma GCC ivdep
  for (int64_t p = begin; p < end; ++p) {
    const T x1 = b1[4 * p], y1 = b1[4 * p + 1], x2 = b1[4 * p + 2], y2 = b1[4 * p + 3];
    const T u1 = b2[4 * p], v1 = b2[4 * p + 1], u2 = b2[4 * p + 2], v2 = b2[4 * p + 3];
    const T iw = (x2 <= u2 ? x2 : u2) - (x1 >= u1 ? x1 : u1);
    const T ih = (y2 <= v2 ? y2 : v2) - (y1 >= v1 ? y1 : v1);
    const T inter = (iw > 0 ? iw : T(0)) * (ih > 0 ? ih : T(0));
    const T union_area = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter;
    const T cw = (x2 >= u2 ? x2 : u2) - (x1 <= u1 ? x1 : u1);
    const T ch = (y2 >= v2 ? y2 : v2) - (y1 <= v1 ? y1 : v1);
    const T hull = cw * ch;
    out[p] = inter / (union_area + eps) - (hull - union_area) / (hull + eps);
  }
}

// Boxes [P, 4] are interleaved; the gradient's eight strided output streams keep the
// compiler from vectorizing well, so tiles are split into coordinate planes, computed plane
// by plane, and interleaved back.
constexpr int64_t kTile = 256;
// Planes are kStride apart, not a multiple of 4 KB: loads and stores whose addresses agree in
// the low 12 bits falsely wait on each other (4K aliasing), which made this kernel 5x slower.
constexpr int64_t kStride = kTile + 16;

template <typename T>
struct Tile {
  alignas(64) T x1[kStride], y1[kStride], x2[kStride], y2[kStride];
  alignas(64) T u1[kStride], v1[kStride], u2[kStride], v2[kStride], g[kStride];
  alignas(64) T d[8][kStride];
};

template <typename T>
void giou_vjp_tile(Tile<T>& t, int64_t count) {
  const T eps = static_cast<T>(kEps);
  T* __restrict d = &t.d[0][0];
#pragma GCC ivdep
  for (int64_t p = 0; p < count; ++p) {
    const T x1 = t.x1[p], y1 = t.y1[p], x2 = t.x2[p], y2 = t.y2[p];
    const T u1 = t.u1[p], v1 = t.v1[p], u2 = t.u2[p], v2 = t.v2[p];
    const T g = t.g[p];
    // Forward, remembering which side each max/min took (ties: boxes1).
    const bool left_1 = x1 >= u1, right_1 = x2 <= u2, top_1 = y1 >= v1, bottom_1 = y2 <= v2;
    const T iw = (right_1 ? x2 : u2) - (left_1 ? x1 : u1);
    const T ih = (bottom_1 ? y2 : v2) - (top_1 ? y1 : v1);
    const bool iw_pos = iw > 0, ih_pos = ih > 0;
    const T iw_c = iw_pos ? iw : T(0), ih_c = ih_pos ? ih : T(0);
    const T inter = iw_c * ih_c;
    const T w1 = x2 - x1, h1 = y2 - y1, w2 = u2 - u1, h2 = v2 - v1;
    const T union_area = w1 * h1 + w2 * h2 - inter;
    const bool hull_left_1 = x1 <= u1, hull_right_1 = x2 >= u2;
    const bool hull_top_1 = y1 <= v1, hull_bottom_1 = y2 >= v2;
    const T cw = (hull_right_1 ? x2 : u2) - (hull_left_1 ? x1 : u1);
    const T ch = (hull_bottom_1 ? y2 : v2) - (hull_top_1 ? y1 : v1);
    const T hull = cw * ch;
    // Backward.
    const T union_e = union_area + eps, hull_e = hull + eps;
    const T inv_union = T(1) / union_e, inv_hull = T(1) / hull_e;  // two divisions, not four
    const T d_union = g * (inv_hull - inter * inv_union * inv_union);
    const T d_inter = g * inv_union - d_union;
    const T d_hull = -g * union_e * inv_hull * inv_hull;
    const T d_iw = iw_pos ? d_inter * ih_c : T(0);
    const T d_ih = ih_pos ? d_inter * iw_c : T(0);
    const T d_cw = d_hull * ch, d_ch = d_hull * cw;
    // Areas enter the union with +1; the intersection and hull edges go to the side the
    // max/min took.
    d[0 * kStride + p] = -d_union * h1 + (left_1 ? -d_iw : T(0)) + (hull_left_1 ? -d_cw : T(0));
    d[1 * kStride + p] = -d_union * w1 + (top_1 ? -d_ih : T(0)) + (hull_top_1 ? -d_ch : T(0));
    d[2 * kStride + p] = d_union * h1 + (right_1 ? d_iw : T(0)) + (hull_right_1 ? d_cw : T(0));
    d[3 * kStride + p] = d_union * w1 + (bottom_1 ? d_ih : T(0)) + (hull_bottom_1 ? d_ch : T(0));
    d[4 * kStride + p] = -d_union * h2 + (left_1 ? T(0) : -d_iw) + (hull_left_1 ? T(0) : -d_cw);
    d[5 * kStride + p] = -d_union * w2 + (top_1 ? T(0) : -d_ih) + (hull_top_1 ? T(0) : -d_ch);
    d[6 * kStride + p] = d_union * h2 + (right_1 ? T(0) : d_iw) + (hull_right_1 ? T(0) : d_cw);
    d[7 * kStride + p] = d_union * w2 + (bottom_1 ? T(0) : d_ih) + (hull_bottom_1 ? T(0) : d_ch);
  }
}

template <typename T>
void giou_vjp_range(const T* __restrict b1, const T* __restrict b2, const T* __restrict g_in,
                    int64_t begin, int64_t end, T* __restrict d1, T* __restrict d2) {
  Tile<T> t;
  for (int64_t start = begin; start < end; start += kTile) {
    const int64_t count = std::min(kTile, end - start);
    for (int64_t p = 0; p < count; ++p) {
      const T* a = b1 + 4 * (start + p);
      const T* b = b2 + 4 * (start + p);
      t.x1[p] = a[0], t.y1[p] = a[1], t.x2[p] = a[2], t.y2[p] = a[3];
      t.u1[p] = b[0], t.v1[p] = b[1], t.u2[p] = b[2], t.v2[p] = b[3];
      t.g[p] = g_in[start + p];
    }
    giou_vjp_tile(t, count);
    for (int64_t p = 0; p < count; ++p) {
      for (int c = 0; c < 4; ++c) d1[4 * (start + p) + c] = t.d[c][p];
    }
    if (d2 == nullptr) continue;  // only boxes1's gradient wanted: half the output traffic
    for (int64_t p = 0; p < count; ++p) {
      for (int c = 0; c < 4; ++c) d2[4 * (start + p) + c] = t.d[4 + c][p];
    }
  }
}

}  // namespace

template <typename T>
void giou(const T* boxes1, const T* boxes2, int64_t pairs, T* out) {
  for_pair_blocks(pairs, [&](int64_t begin, int64_t end) {
    giou_range(boxes1, boxes2, begin, end, out);
  });
}

template <typename T>
void giou_vjp(const T* boxes1, const T* boxes2, const T* cotangent, int64_t pairs, T* d_boxes1,
              T* d_boxes2) {
  for_pair_blocks(pairs, [&](int64_t begin, int64_t end) {
    giou_vjp_range(boxes1, boxes2, cotangent, begin, end, d_boxes1, d_boxes2);
  });
}

template void giou<float>(const float*, const float*, int64_t, float*);
template void giou<double>(const double*, const double*, int64_t, double*);
template void giou_vjp<float>(const float*, const float*, const float*, int64_t, float*, float*);
template void giou_vjp<double>(const double*, const double*, const double*, int64_t, double*,
                               double*);

}  // namespace asickernels_cpu
