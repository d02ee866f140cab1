// The kernels of kernels.h, each forwarding to its instruction-set level's definition: the
// best level this CPU runs (checked once, with the compiler's CPU-feature builtins), so one
// build is correct on any x86-64 CPU and uses AVX2 or AVX-512 where the CPU has them. Every
// level computes the same results bit for bit (no FMA contraction, no reassociation).
#include <algorithm>
#include <atomic>

#include "kernels.h"

namespace asickernels_cpu {
namespace {

IsaLevel detect() {
#if defined(ASICKERNELS_CPU_X86_LEVELS)
  __builtin_cpu_init();
  // x86-64-v4 (what -march=x86-64-v4 may use) and VNNI (the int8 microkernel).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
    return IsaLevel::kAvx512;
  }
  // x86-64-v3's vector and bit-manipulation extensions.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
      __builtin_cpu_supports("f16c")) {
    return IsaLevel::kAvx2;
  }
#endif
  return IsaLevel::kBaseline;
}

std::atomic<IsaLevel>& current() {
  static std::atomic<IsaLevel> level{best_isa_level()};
  return level;
}

}  // namespace

IsaLevel best_isa_level() {
  static const IsaLevel best = detect();
  return best;
}

IsaLevel isa_level() { return current().load(std::memory_order_relaxed); }

void use_isa_level(IsaLevel level) {
  current().store(std::min(level, best_isa_level()), std::memory_order_relaxed);
}

#if defined(ASICKERNELS_CPU_X86_LEVELS)
#define AK_DISPATCH(call)              \
  switch (isa_level()) {               \
    case IsaLevel::kAvx512:            \
      return avx512::call;             \
    case IsaLevel::kAvx2:              \
      return avx2::call;               \
    case IsaLevel::kBaseline:          \
      break;                           \
  }                                    \
  return baseline::call
#else
#define AK_DISPATCH(call) return baseline::call
#endif

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

template <typename T>
void nms(const T* boxes, const T* scores, const int32_t* categories, int64_t batch, int64_t n,
         const NmsParams& params, int32_t* indices, int32_t* num_valid) {
  AK_DISPATCH(nms(boxes, scores, categories, batch, n, params, indices, num_valid));
}

void int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                 const float* x_scale, const float* y_scale, MatmulOut out_kind, void* out) {
  AK_DISPATCH(int8_matmul(x, y, m, k, n, x_scale, y_scale, out_kind, out));
}

const char* int8_matmul_path() { AK_DISPATCH(int8_matmul_path()); }

#define AK_FLOAT_KERNELS(T)                                                                    \
  template void paired_box_metric<T>(BoxMetric, const T*, const T*, int64_t, T*);              \
  template void paired_box_metric_vjp<T>(BoxMetric, const T*, const T*, const T*, int64_t, T*, \
                                         T*);                                                  \
  template void pairwise_box_metric<T>(BoxMetric, const T*, const T*, int64_t, int64_t,        \
                                       int64_t, T*);                                           \
  template void pairwise_box_metric_vjp<T>(BoxMetric, const T*, const T*, const T*, int64_t,   \
                                           int64_t, int64_t, T*, T*);                          \
  template void nms<T>(const T*, const T*, const int32_t*, int64_t, int64_t, const NmsParams&, \
                       int32_t*, int32_t*);
AK_FLOAT_KERNELS(float)
AK_FLOAT_KERNELS(double)

}  // namespace asickernels_cpu
