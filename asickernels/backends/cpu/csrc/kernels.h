// The native CPU kernels of asickernels, shared by the XLA FFI handlers (xla_ffi.cpp) and
// the C entry points the host (numpy) path calls through ctypes (host_api.cpp).
//
// The kernel sources (box_iou.cpp, nms.cpp, int8_matmul.cpp) are compiled once per
// instruction-set level (setup.py), each into the namespace asickernels_cpu::<level> that
// ASICKERNELS_CPU_ISA names; dispatch.cpp defines the asickernels_cpu:: kernels, which run
// the best level this CPU has. A build of one level (the sanitizer build) has the baseline.
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

struct NmsParams {
  double iou_threshold;
  int64_t max_output_size;
  double score_threshold;  // -inf for none
};

enum class MatmulOut { kInt32 = 0, kFloat32 = 1, kFloat64 = 2 };

// Instruction-set levels of the kernels, lowest first (dispatch.cpp): baseline (the
// compiler's default target), avx2 (x86-64-v3), avx512 (x86-64-v4 with AVX-512 VNNI).
enum class IsaLevel : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
// The best level of this build that this CPU runs.
IsaLevel best_isa_level();
// The level the kernels run: best_isa_level() unless lowered by use_isa_level.
IsaLevel isa_level();
// Runs the kernels at min(level, best_isa_level()) from now on (to test a lower level).
void use_isa_level(IsaLevel level);

}  // namespace asickernels_cpu

#ifndef ASICKERNELS_CPU_ISA
#define ASICKERNELS_CPU_ISA baseline
#endif

// The kernels: the dispatching entry points, then each level's.
namespace asickernels_cpu {
#include "kernel_api.inc"
namespace baseline {
#include "kernel_api.inc"
}  // namespace baseline
namespace avx2 {
#include "kernel_api.inc"
}  // namespace avx2
namespace avx512 {
#include "kernel_api.inc"
}  // namespace avx512
}  // namespace asickernels_cpu
