// What every op's file of the native CPU library shares. An op's file (nms.cpp, box_iou.cpp,
// int8_matmul.cpp, ...) holds, in this order:
//
//   1. its kernels' declarations, in every instruction-set level's namespace (AK_EVERY_LEVEL);
//   2. the kernels, in namespace asickernels_cpu::ASICKERNELS_CPU_ISA;
//   3. under #ifdef ASICKERNELS_CPU_ENTRY_POINTS: the dispatching kernels (AK_DISPATCH), its
//      XLA FFI handlers (symbols asickernels_cpu_ffi_<name>, which Python registers by that
//      name) and its host entry points (extern "C" asickernels_cpu_<name>, called through
//      ctypes by the op's Python module, which declares their argument types).
//
// setup.py compiles each op's file once per level (baseline, avx2, avx512 on x86-64), with
// ASICKERNELS_CPU_ISA naming the level; the baseline compile also defines
// ASICKERNELS_CPU_ENTRY_POINTS. dispatch.cpp and parallel.cpp are compiled once. A build that
// compiles every file once without those macros (the sanitizer build) gets the baseline with
// the entry points. No other file lists the ops: adding one is adding its file.
//
// Semantics are the float64 references' (asickernels/reference.py, kernels/nms.py,
// kernels/roi_*.py). Every level computes the same results bit for bit (no FMA contraction,
// no reassociation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>

#ifndef ASICKERNELS_CPU_ISA
#define ASICKERNELS_CPU_ISA baseline
#define ASICKERNELS_CPU_ENTRY_POINTS 1
#endif

namespace asickernels_cpu {

// Runs task(i) for i in [0, count) on up to max_threads() threads (the caller is one of
// them). Runs serially when count == 1, when max_threads() == 1, or when another call is
// already using the pool (XLA may run two handlers at once).
void parallel_for(int64_t count, const std::function<void(int64_t)>& task);
int max_threads();
void set_max_threads(int threads);

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

// Declares a kernel (the macro's argument) in every level's namespace: each level's compile
// of the op's file defines it in its own, and the entry points dispatch between them.
#define AK_EVERY_LEVEL(...)        \
  namespace baseline {             \
  __VA_ARGS__                      \
  }                                \
  namespace avx2 {                 \
  __VA_ARGS__                      \
  }                                \
  namespace avx512 {               \
  __VA_ARGS__                      \
  }

// `return <level>::call` for the level the kernels run (isa_level()).
#if defined(ASICKERNELS_CPU_X86_LEVELS)
#define AK_DISPATCH(call)                                  \
  switch (::asickernels_cpu::isa_level()) {                \
    case ::asickernels_cpu::IsaLevel::kAvx512:             \
      return ::asickernels_cpu::avx512::call;              \
    case ::asickernels_cpu::IsaLevel::kAvx2:               \
      return ::asickernels_cpu::avx2::call;                \
    case ::asickernels_cpu::IsaLevel::kBaseline:           \
      break;                                               \
  }                                                        \
  return ::asickernels_cpu::baseline::call
#else
#define AK_DISPATCH(call) return ::asickernels_cpu::baseline::call
#endif

#ifdef ASICKERNELS_CPU_ENTRY_POINTS
#include "xla/ffi/api/ffi.h"

namespace asickernels_cpu::entry {

namespace ffi = xla::ffi;

template <ffi::DataType kType>
using Native = ffi::NativeType<kType>;

// An FFI handler's result: Success, or kResourceExhausted when run() ran out of memory.
template <typename Run>
ffi::Error ffi_guarded(Run&& run) {
  try {
    run();
    return ffi::Error::Success();
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "asickernels cpu: out of memory");
  }
}

// A host entry point's status: 0, or 1 when run() returns false (an unknown dtype or code),
// or 2 when it ran out of memory (asickernels/backends/cpu/_library.py's check()).
template <typename Run>
int host_guarded(Run&& run) {
  try {
    return run() ? 0 : 1;
  } catch (const std::bad_alloc&) {
    return 2;
  }
}

// Runs run(T{}) with T the float type of host dtype code 0 (float) or 1 (double); the status.
template <typename Run>
int with_float(int dtype, Run&& run) {
  return host_guarded([&] {
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

}  // namespace asickernels_cpu::entry
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
