// The kernels' instruction-set level: the best level this CPU runs (checked once, with
// CPUID and XGETBV), so one build is correct on any x86-64 CPU and uses AVX2 or AVX-512
// where the CPU has them. Each op's dispatching entry points (AK_DISPATCH in kernels.h) run
// the level isa_level() returns.
#include <algorithm>
#include <atomic>

#if defined(ASICKERNELS_CPU_X86_LEVELS)
#include <cpuid.h>
#endif

#include "kernels.h"

namespace asickernels_cpu {
namespace {

#if defined(ASICKERNELS_CPU_X86_LEVELS)
// CPUID read here rather than through __builtin_cpu_supports: the wheel's toolchain (zig,
// setup.py) has a compiler runtime whose CPU-feature data is a stub that reports nothing.
// Bits: Intel SDM vol. 2A, CPUID leaves 1 and 7; XCR0: vol. 1, 13.3.
constexpr unsigned kFma = 1u << 12, kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;
constexpr unsigned kAvx2 = 1u << 5, kBmi = 1u << 3, kBmi2 = 1u << 8;
constexpr unsigned kAvx512f = 1u << 16, kAvx512dq = 1u << 17, kAvx512cd = 1u << 28;
constexpr unsigned kAvx512bw = 1u << 30, kAvx512vl = 1u << 31, kAvx512vnni = 1u << 11;
// XCR0: the OS saves SSE and AVX state (bits 1, 2), and the AVX-512 state (bits 5-7).
constexpr unsigned kYmmState = 0x6, kZmmState = 0xe6;

bool all(unsigned bits, unsigned wanted) { return (bits & wanted) == wanted; }

IsaLevel detect() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !all(ecx, kOsxsave | kAvx | kFma | kF16c)) {
    return IsaLevel::kBaseline;
  }
  unsigned xcr0, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  if (!all(xcr0, kYmmState) || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    return IsaLevel::kBaseline;
  }
  // x86-64-v4 (what -march=x86-64-v4 may use) and VNNI (the int8 microkernel).
  if (all(xcr0, kZmmState) &&
      all(ebx, kAvx512f | kAvx512dq | kAvx512cd | kAvx512bw | kAvx512vl | kAvx2 | kBmi | kBmi2) &&
      all(ecx, kAvx512vnni)) {
    return IsaLevel::kAvx512;
  }
  // x86-64-v3's vector and bit-manipulation extensions.
  if (all(ebx, kAvx2 | kBmi | kBmi2)) return IsaLevel::kAvx2;
  return IsaLevel::kBaseline;
}
#else
IsaLevel detect() { return IsaLevel::kBaseline; }
#endif

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

// The library's own C functions (the ops' kernels are reached through their FFI handlers,
// binding.cpp). Levels:
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
