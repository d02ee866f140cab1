// The kernels' instruction-set level: the best level this CPU runs (checked once, with the
// compiler's CPU-feature builtins), so one build is correct on any x86-64 CPU and uses AVX2
// or AVX-512 where the CPU has them. Each op's dispatching entry points (AK_DISPATCH in
// kernels.h) run the level isa_level() returns.
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

}  // namespace asickernels_cpu

// Host entry points of the library as a whole (the ops' are in their files). Levels:
// 0 = baseline, 1 = avx2, 2 = avx512 (asickernels_cpu::IsaLevel).
extern "C" {

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

}  // extern "C"
