// The native CPU kernels of asickernels, shared by the XLA FFI handlers (xla_ffi.cpp) and
// the C entry points the host (numpy) path calls through ctypes (host_api.cpp).
//
// Semantics are asickernels/reference.py's. T is float or double: every kernel computes in
// its input's precision, except NMS, whose IoU decisions are always made in double, so that
// float32 boxes are decided exactly as the float64 reference decides them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace asickernels_cpu {

// Runs task(i) for i in [0, count) on up to max_threads() threads (the caller is one of
// them). Runs serially when count == 1, when max_threads() == 1, or when another call is
// already using the pool (XLA may run two handlers at once).
void parallel_for(int64_t count, const std::function<void(int64_t)>& task);
int max_threads();
void set_max_threads(int threads);

// Box-pair metrics (asickernels/reference.py's METRICS); the codes are those of the host
// entry points and of the FFI handlers' "metric" attribute.
enum class BoxMetric : int64_t { kIou = 0, kGiou = 1, kDiou = 2, kCiou = 3 };

inline bool is_box_metric(int64_t code) { return code >= 0 && code <= 3; }

// metric [P] of paired boxes [P, 4].
template <typename T>
void paired_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t pairs,
                       T* out);

// Gradient of sum(cotangent * metric) with respect to boxes1 and boxes2 ([P, 4] each), CIoU's
// alpha held constant; d_boxes2 may be nullptr when only boxes1's gradient is wanted.
template <typename T>
void paired_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                           const T* cotangent, int64_t pairs, T* d_boxes1, T* d_boxes2);

// metric [B, N, M] of every pair of boxes1 [B, N, 4] and boxes2 [B, M, 4].
template <typename T>
void pairwise_box_metric(BoxMetric metric, const T* boxes1, const T* boxes2, int64_t batch,
                         int64_t n, int64_t m, T* out);

// Gradient of sum(cotangent [B, N, M] * metric) with respect to boxes1 and boxes2.
template <typename T>
void pairwise_box_metric_vjp(BoxMetric metric, const T* boxes1, const T* boxes2,
                             const T* cotangent, int64_t batch, int64_t n, int64_t m,
                             T* d_boxes1, T* d_boxes2);

struct NmsParams {
  double iou_threshold;
  int64_t max_output_size;
  double score_threshold;  // -inf for none
};

// Greedy NMS per image: boxes [B, N, 4], scores [B, N], categories [B, N] or nullptr ->
// indices [B, max_output_size] (padded with -1), num_valid [B].
template <typename T>
void nms(const T* boxes, const T* scores, const int32_t* categories, int64_t batch, int64_t n,
         const NmsParams& params, int32_t* indices, int32_t* num_valid);

enum class MatmulOut { kInt32 = 0, kFloat32 = 1, kFloat64 = 2 };

// x [M, K] int8 @ y [K, N] int8, exact int32 accumulation. kInt32 writes int32 and ignores
// the scales; the float outputs write acc * x_scale[m] * y_scale[n] computed in double and
// rounded once (scales may be nullptr: 1).
void int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                 const float* x_scale, const float* y_scale, MatmulOut out_kind, void* out);

// "avx512-vnni" or "portable": which int8 microkernel this build has.
const char* int8_matmul_path();

}  // namespace asickernels_cpu
