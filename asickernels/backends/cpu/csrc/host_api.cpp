// C entry points for the host (numpy) path, called through ctypes with raw pointers to
// C-contiguous arrays. dtype codes: 0 = float32, 1 = float64. Every entry point returns 0,
// or 1 for an unknown dtype or metric code, or 2 when the kernel failed (out of memory).
#include <cstdint>
#include <new>

#include "kernels.h"

namespace {

template <typename Run>
int guarded(Run&& run) {
  try {
    return run() ? 0 : 1;
  } catch (const std::bad_alloc&) {
    return 2;
  }
}

// Runs run(T{}) with T the float type of dtype code 0 (float) or 1 (double).
template <typename Run>
int with_float(int dtype, Run&& run) {
  return guarded([&] {
    if (dtype == 0) {
      run(0.0f);
    } else if (dtype == 1) {
      run(0.0);
    } else {
      return false;
    }
    return true;
  });
}

// Runs run(metric, T{}) for a box metric code and a dtype code.
template <typename Run>
int with_metric_and_float(int metric, int dtype, Run&& run) {
  if (!asickernels_cpu::is_box_metric(metric)) return 1;
  const auto kind = static_cast<asickernels_cpu::BoxMetric>(metric);
  return with_float(dtype, [&](auto zero) { run(kind, zero); });
}

}  // namespace

extern "C" {

int asickernels_cpu_max_threads() { return asickernels_cpu::max_threads(); }

void asickernels_cpu_set_max_threads(int threads) { asickernels_cpu::set_max_threads(threads); }

const char* asickernels_cpu_int8_matmul_path() { return asickernels_cpu::int8_matmul_path(); }

// Instruction-set levels: 0 = baseline, 1 = avx2, 2 = avx512 (asickernels_cpu::IsaLevel).
int asickernels_cpu_best_isa_level() { return static_cast<int>(asickernels_cpu::best_isa_level()); }

int asickernels_cpu_isa_level() { return static_cast<int>(asickernels_cpu::isa_level()); }

// Runs the kernels at min(level, best) from now on; returns the level in effect, or -1 for
// an unknown level.
int asickernels_cpu_use_isa_level(int level) {
  if (level < 0 || level > 2) return -1;
  asickernels_cpu::use_isa_level(static_cast<asickernels_cpu::IsaLevel>(level));
  return asickernels_cpu_isa_level();
}

int asickernels_cpu_sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#else
  return 0;
#endif
}

// metric: 0 = IoU, 1 = GIOU, 2 = DIoU, 3 = CIoU (asickernels_cpu::BoxMetric).
int asickernels_cpu_paired_box_metric(int metric, int dtype, const void* boxes1,
                                      const void* boxes2, int64_t pairs, void* out) {
  return with_metric_and_float(metric, dtype, [&](auto kind, auto zero) {
    using T = decltype(zero);
    asickernels_cpu::paired_box_metric(kind, static_cast<const T*>(boxes1),
                                       static_cast<const T*>(boxes2), pairs, static_cast<T*>(out));
  });
}

// d_boxes2 may be null (boxes1's gradient only).
int asickernels_cpu_paired_box_metric_vjp(int metric, int dtype, const void* boxes1,
                                          const void* boxes2, const void* cotangent,
                                          int64_t pairs, void* d_boxes1, void* d_boxes2) {
  return with_metric_and_float(metric, dtype, [&](auto kind, auto zero) {
    using T = decltype(zero);
    asickernels_cpu::paired_box_metric_vjp(
        kind, static_cast<const T*>(boxes1), static_cast<const T*>(boxes2),
        static_cast<const T*>(cotangent), pairs, static_cast<T*>(d_boxes1),
        static_cast<T*>(d_boxes2));
  });
}

int asickernels_cpu_pairwise_box_metric(int metric, int dtype, const void* boxes1,
                                        const void* boxes2, int64_t batch, int64_t n, int64_t m,
                                        void* out) {
  return with_metric_and_float(metric, dtype, [&](auto kind, auto zero) {
    using T = decltype(zero);
    asickernels_cpu::pairwise_box_metric(kind, static_cast<const T*>(boxes1),
                                         static_cast<const T*>(boxes2), batch, n, m,
                                         static_cast<T*>(out));
  });
}

int asickernels_cpu_pairwise_box_metric_vjp(int metric, int dtype, const void* boxes1,
                                            const void* boxes2, const void* cotangent,
                                            int64_t batch, int64_t n, int64_t m, void* d_boxes1,
                                            void* d_boxes2) {
  return with_metric_and_float(metric, dtype, [&](auto kind, auto zero) {
    using T = decltype(zero);
    asickernels_cpu::pairwise_box_metric_vjp(
        kind, static_cast<const T*>(boxes1), static_cast<const T*>(boxes2),
        static_cast<const T*>(cotangent), batch, n, m, static_cast<T*>(d_boxes1),
        static_cast<T*>(d_boxes2));
  });
}

// categories may be null (plain NMS).
int asickernels_cpu_nms(int dtype, const void* boxes, const void* scores,
                        const int32_t* categories, int64_t batch, int64_t n,
                        double iou_threshold, int64_t max_output_size, double score_threshold,
                        int32_t* indices, int32_t* num_valid) {
  const asickernels_cpu::NmsParams params{iou_threshold, max_output_size, score_threshold};
  return with_float(dtype, [&](auto zero) {
    using T = decltype(zero);
    asickernels_cpu::nms(static_cast<const T*>(boxes), static_cast<const T*>(scores), categories,
                         batch, n, params, indices, num_valid);
  });
}

// out_kind: 0 = int32 (scales ignored), 1 = float32, 2 = float64; scales may be null.
int asickernels_cpu_int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k,
                                int64_t n, const float* x_scale, const float* y_scale,
                                int out_kind, void* out) {
  return guarded([&] {
    if (out_kind < 0 || out_kind > 2) return false;
    asickernels_cpu::int8_matmul(x, y, m, k, n, x_scale, y_scale,
                                 static_cast<asickernels_cpu::MatmulOut>(out_kind), out);
    return true;
  });
}

}  // extern "C"
