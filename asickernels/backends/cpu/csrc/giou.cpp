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

template <typename T>
void giou_vjp_range(const T* __restrict b1, const T* __restrict b2, const T* __restrict g_in,
                    int64_t begin, int64_t end, T* __restrict d1, T* __restrict d2) {
  const T eps = static_cast<T>(kEps);
#pragma GCC ivdep
  for (int64_t p = begin; p < end; ++p) {
    const T x1 = b1[4 * p], y1 = b1[4 * p + 1], x2 = b1[4 * p + 2], y2 = b1[4 * p + 3];
    const T u1 = b2[4 * p], v1 = b2[4 * p + 1], u2 = b2[4 * p + 2], v2 = b2[4 * p + 3];
    const T g = g_in[p];
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
    const T d_union = g * (T(1) / hull_e - inter / (union_e * union_e));
    const T d_inter = g / union_e - d_union;
    const T d_hull = -g * union_e / (hull_e * hull_e);
    const T d_iw = iw_pos ? d_inter * ih_c : T(0);
    const T d_ih = ih_pos ? d_inter * iw_c : T(0);
    const T d_cw = d_hull * ch, d_ch = d_hull * cw;
    // Areas enter the union with +1; the intersection and hull edges go to the side the
    // max/min took.
    const T a_x1 = -d_union * h1, a_x2 = d_union * h1, a_y1 = -d_union * w1, a_y2 = d_union * w1;
    const T b_x1 = -d_union * h2, b_x2 = d_union * h2, b_y1 = -d_union * w2, b_y2 = d_union * w2;
    d1[4 * p] = a_x1 + (left_1 ? -d_iw : T(0)) + (hull_left_1 ? -d_cw : T(0));
    d1[4 * p + 1] = a_y1 + (top_1 ? -d_ih : T(0)) + (hull_top_1 ? -d_ch : T(0));
    d1[4 * p + 2] = a_x2 + (right_1 ? d_iw : T(0)) + (hull_right_1 ? d_cw : T(0));
    d1[4 * p + 3] = a_y2 + (bottom_1 ? d_ih : T(0)) + (hull_bottom_1 ? d_ch : T(0));
    d2[4 * p] = b_x1 + (left_1 ? T(0) : -d_iw) + (hull_left_1 ? T(0) : -d_cw);
    d2[4 * p + 1] = b_y1 + (top_1 ? T(0) : -d_ih) + (hull_top_1 ? T(0) : -d_ch);
    d2[4 * p + 2] = b_x2 + (right_1 ? T(0) : d_iw) + (hull_right_1 ? T(0) : d_cw);
    d2[4 * p + 3] = b_y2 + (bottom_1 ? T(0) : d_ih) + (hull_bottom_1 ? T(0) : d_ch);
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
