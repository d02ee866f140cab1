// int8 x int8 -> int32 matmul, exact.
//
// AVX-512 VNNI path (chosen at build time by -march=native): vpdpbusd multiplies unsigned by
// signed bytes, so x is stored as x + 128 (x ^ 0x80 as uint8) and the sum is corrected by
// -128 * column sums of y. The arithmetic wraps modulo 2^32 (the instruction, and uint32 for
// the correction); the true result fits int32 (K <= 131071), so the wrapped one equals it.
// Goto-style blocking: y is packed once into panels of 32 columns x 4-byte K groups (two
// zmm per K group), x into uint8 rows; a 6 x 32 microkernel keeps 12 accumulators; tasks of
// (192 rows x 256 columns) run on the thread pool.
//
// Portable path (any other CPU): row-times-matrix loops the compiler vectorizes.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "csrc/kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define ASICKERNELS_CPU_VNNI 1
#endif

namespace asickernels_cpu {

enum class MatmulOut { kInt32 = 0, kFloat32 = 1, kFloat64 = 2 };

AK_EVERY_LEVEL(
    // x [M, K] int8 @ y [K, N] int8, exact int32 accumulation. kInt32 writes int32 and
    // ignores the scales; the float outputs write acc * x_scale[m] * y_scale[n] computed in
    // double and rounded once (scales may be nullptr: 1).
    void int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                     const float* x_scale, const float* y_scale, MatmulOut out_kind, void* out);

    // "avx512-vnni" or "portable": which int8 microkernel runs.
    const char* int8_matmul_path();)

}  // namespace asickernels_cpu

namespace asickernels_cpu::ASICKERNELS_CPU_ISA {
namespace {

// Below this many multiply-adds the call stays on one thread.
constexpr int64_t kParallelMacs = int64_t{1} << 22;

struct AlignedFree {
  void operator()(void* pointer) const { std::free(pointer); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], AlignedFree>;

template <typename T>
Buffer<T> allocate(int64_t count) {
  const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64))));
}

#ifdef ASICKERNELS_CPU_VNNI

constexpr int64_t kMR = 6;    // microkernel rows
constexpr int64_t kNR = 32;   // microkernel columns: two zmm of int32
constexpr int64_t kKC = 512;  // K bytes per block (multiple of 4)
constexpr int64_t kMC = 192;  // rows per task (multiple of kMR)
constexpr int64_t kNC = 256;  // columns per task (multiple of kNR)

struct Packed {
  int64_t m, k, n, k_padded, panels;
  Buffer<uint8_t> x;     // [m / kMR][k_padded / 4][kMR][4] x ^ 0x80, zero padded
  Buffer<int8_t> y;      // [panels][k_padded / 4][kNR][4], zero padded
  Buffer<uint32_t> bias; // [panels * kNR] -128 * column sums of y, modulo 2^32
};

// acc += x (uint8) . y (int8) per 4-byte group. Inline assembly rather than
// _mm512_dpbusd_epi32: with the intrinsic, GCC 12 copies every accumulator to another
// register on each K step (the instruction overwrites its accumulator operand).
inline void dot_accumulate(__m512i& acc, __m512i x, __m512i y) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(y));
}

// Packs rows [4g, 4g + 4) of a full 32-column panel for every whole K group g < groups:
// a 4 x 32 byte transpose into 32 column quads, whose sums vpdpbusd with ones accumulates.
void pack_panel_groups(const int8_t* y, int64_t n, int64_t groups, int8_t* out, uint32_t* sums) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum0 = _mm512_setzero_si512(), sum1 = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* row = y + 4 * g * n;
    const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + n));
    const __m256i r2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * n));
    const __m256i r3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 3 * n));
    const __m256i t0 = _mm256_unpacklo_epi8(r0, r1), t1 = _mm256_unpackhi_epi8(r0, r1);
    const __m256i t2 = _mm256_unpacklo_epi8(r2, r3), t3 = _mm256_unpackhi_epi8(r2, r3);
    const __m256i u0 = _mm256_unpacklo_epi16(t0, t2), u1 = _mm256_unpackhi_epi16(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi16(t1, t3), u3 = _mm256_unpackhi_epi16(t1, t3);
    // Quads of columns 0-7, 8-15, 16-23, 24-31.
    const __m512i low = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_permute2x128_si256(u0, u1, 0x20)),
        _mm256_permute2x128_si256(u2, u3, 0x20), 1);
    const __m512i high = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_permute2x128_si256(u0, u1, 0x31)),
        _mm256_permute2x128_si256(u2, u3, 0x31), 1);
    _mm512_storeu_si512(out + g * 128, low);
    _mm512_storeu_si512(out + g * 128 + 64, high);
    dot_accumulate(sum0, ones, low);
    dot_accumulate(sum1, ones, high);
  }
  _mm512_storeu_si512(sums, sum0);
  _mm512_storeu_si512(sums + 16, sum1);
}

void pack(const int8_t* x, const int8_t* y, Packed& p, bool parallel) {
  p.k_padded = (p.k + 3) / 4 * 4;
  p.panels = (p.n + kNR - 1) / kNR;
  const int64_t row_panels = (p.m + kMR - 1) / kMR;
  p.x = allocate<uint8_t>(row_panels * p.k_padded * kMR);
  p.y = allocate<int8_t>(p.panels * p.k_padded * kNR);
  p.bias = allocate<uint32_t>(p.panels * kNR);
  // Each K group of kMR rows is 24 contiguous bytes: the microkernel's broadcasts then read
  // one stream (rows k_padded apart could share cache sets: 4 KB apart for K = 4096).
  auto pack_rows = [&](int64_t panel) {
    uint8_t* out = p.x.get() + panel * p.k_padded * kMR;
    std::memset(out, 0, static_cast<size_t>(p.k_padded * kMR));
    for (int64_t r = 0; r < kMR && panel * kMR + r < p.m; ++r) {
      const int8_t* in = x + (panel * kMR + r) * p.k;
      const int64_t whole = p.k / 4;
      for (int64_t g = 0; g < whole; ++g) {
        uint32_t quad;
        std::memcpy(&quad, in + 4 * g, sizeof(quad));
        quad ^= 0x80808080u;
        std::memcpy(out + g * kMR * 4 + r * 4, &quad, sizeof(quad));
      }
      for (int64_t kk = whole * 4; kk < p.k; ++kk) {
        out[whole * kMR * 4 + r * 4 + kk % 4] = static_cast<uint8_t>(in[kk]) ^ 0x80u;
      }
    }
  };
  auto pack_panel = [&](int64_t panel) {
    int8_t* out = p.y.get() + panel * p.k_padded * kNR;
    uint32_t* bias = p.bias.get() + panel * kNR;
    std::memset(out, 0, static_cast<size_t>(p.k_padded * kNR));
    const int64_t col0 = panel * kNR, cols = std::min(kNR, p.n - col0);
    uint32_t sums[kNR] = {};
    int64_t kk = 0;
    if (cols == kNR) {
      pack_panel_groups(y + col0, p.n, p.k / 4, out, sums);
      kk = p.k / 4 * 4;
    }
    for (; kk < p.k; ++kk) {
      const int8_t* row = y + kk * p.n + col0;
      int8_t* group = out + (kk / 4) * kNR * 4 + (kk % 4);
      for (int64_t c = 0; c < cols; ++c) {
        group[c * 4] = row[c];
        sums[c] += static_cast<uint32_t>(static_cast<int32_t>(row[c]));
      }
    }
    for (int64_t c = 0; c < kNR; ++c) bias[c] = 0u - 128u * sums[c];
  };
  if (parallel) {
    parallel_for(row_panels, pack_rows);
    parallel_for(p.panels, pack_panel);
  } else {
    for (int64_t panel = 0; panel < row_panels; ++panel) pack_rows(panel);
    for (int64_t panel = 0; panel < p.panels; ++panel) pack_panel(panel);
  }
}

// c[rows, 32] (+)= x'[rows, k0:k0+kc] . y_panel[k0:k0+kc, 32]; the first K block starts from
// the bias. Columns beyond the matrix are masked off.
template <int kRows>
void microkernel(const uint8_t* x, const int8_t* y_panel, int64_t k_groups,
                 const uint32_t* bias, bool first, int32_t* c, int64_t ldc, __mmask16 mask0,
                 __mmask16 mask1) {
  // Named accumulators (with an array GCC also spilled them).
  __m512i c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  const __m512i bias0 = _mm512_loadu_si512(bias), bias1 = _mm512_loadu_si512(bias + 16);
#define AK_LOAD(r)                                                                      \
  if constexpr (kRows > r) {                                                           \
    c##r##0 = first ? bias0 : _mm512_maskz_loadu_epi32(mask0, c + (r) * ldc);          \
    c##r##1 = first ? bias1 : _mm512_maskz_loadu_epi32(mask1, c + (r) * ldc + 16);     \
  }
  AK_LOAD(0) AK_LOAD(1) AK_LOAD(2) AK_LOAD(3) AK_LOAD(4) AK_LOAD(5)
#undef AK_LOAD
  int64_t g = 0;
  do {  // k_groups >= 1; a do-while spares GCC the register copies a zero-trip loop cost
    const __m512i y0 = _mm512_loadu_si512(y_panel + g * 128);
    const __m512i y1 = _mm512_loadu_si512(y_panel + g * 128 + 64);
#define AK_STEP(r)                                                         \
  if constexpr (kRows > r) {                                               \
    int32_t quad;                                                          \
    std::memcpy(&quad, x + g * kMR * 4 + (r) * 4, sizeof(quad));           \
    const __m512i xv = _mm512_set1_epi32(quad);                            \
    dot_accumulate(c##r##0, xv, y0);                                       \
    dot_accumulate(c##r##1, xv, y1);                                       \
  }
    AK_STEP(0) AK_STEP(1) AK_STEP(2) AK_STEP(3) AK_STEP(4) AK_STEP(5)
#undef AK_STEP
  } while (++g < k_groups);
#define AK_STORE(r)                                                  \
  if constexpr (kRows > r) {                                         \
    _mm512_mask_storeu_epi32(c + (r) * ldc, mask0, c##r##0);         \
    _mm512_mask_storeu_epi32(c + (r) * ldc + 16, mask1, c##r##1);    \
  }
  AK_STORE(0) AK_STORE(1) AK_STORE(2) AK_STORE(3) AK_STORE(4) AK_STORE(5)
#undef AK_STORE
}

using Microkernel = void (*)(const uint8_t*, const int8_t*, int64_t, const uint32_t*, bool,
                             int32_t*, int64_t, __mmask16, __mmask16);
constexpr Microkernel kMicrokernels[kMR + 1] = {nullptr,         microkernel<1>, microkernel<2>,
                                                microkernel<3>,  microkernel<4>, microkernel<5>,
                                                microkernel<6>};

__mmask16 column_mask(int64_t columns) {
  return columns >= 16 ? __mmask16(0xffff)
                       : columns <= 0 ? __mmask16(0) : __mmask16((1u << columns) - 1u);
}

void matmul_int32(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                  int32_t* c) {
  const bool parallel = m * k * n >= kParallelMacs;
  Packed p{m, k, n, 0, 0, nullptr, nullptr, nullptr};
  pack(x, y, p, parallel);
  // Row blocks of at most kMC rows, equal up to the microkernel's kMR: 256 rows give two
  // tasks of 128, not 192 and 64.
  const int64_t row_blocks = (m + kMC - 1) / kMC, col_blocks = (n + kNC - 1) / kNC;
  const int64_t block_rows = ((m + row_blocks - 1) / row_blocks + kMR - 1) / kMR * kMR;
  auto task = [&](int64_t t) {
    const int64_t row0 = (t / col_blocks) * block_rows;
    const int64_t rows = std::min(block_rows, m - row0);
    if (rows <= 0) return;
    const int64_t col0 = (t % col_blocks) * kNC, cols = std::min(kNC, n - col0);
    for (int64_t k0 = 0; k0 < p.k_padded; k0 += kKC) {
      const int64_t groups = std::min(kKC, p.k_padded - k0) / 4;
      for (int64_t j = col0; j < col0 + cols; j += kNR) {
        const int64_t panel = j / kNR;
        const int8_t* y_panel = p.y.get() + panel * p.k_padded * kNR + k0 * kNR;
        const __mmask16 mask0 = column_mask(n - j), mask1 = column_mask(n - j - 16);
        for (int64_t i = row0; i < row0 + rows; i += kMR) {
          const int64_t r = std::min(kMR, row0 + rows - i);
          kMicrokernels[r](p.x.get() + (i / kMR) * p.k_padded * kMR + k0 * kMR, y_panel, groups,
                           p.bias.get() + panel * kNR, k0 == 0, c + i * n + j, n, mask0, mask1);
        }
      }
    }
  };
  if (parallel) {
    parallel_for(row_blocks * col_blocks, task);
  } else {
    for (int64_t t = 0; t < row_blocks * col_blocks; ++t) task(t);
  }
}

#else  // portable

void matmul_int32(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                  int32_t* c) {
  auto row = [&](int64_t i) {
    int32_t* __restrict out = c + i * n;
    std::fill(out, out + n, 0);
    for (int64_t kk = 0; kk < k; ++kk) {
      const int32_t a = x[i * k + kk];
      const int8_t* __restrict b = y + kk * n;
      for (int64_t j = 0; j < n; ++j) out[j] += a * static_cast<int32_t>(b[j]);
    }
  };
  if (m * k * n >= kParallelMacs) {
    parallel_for(m, row);
  } else {
    for (int64_t i = 0; i < m; ++i) row(i);
  }
}

#endif

template <typename Out>
void dequantize(const int32_t* acc, int64_t m, int64_t n, const float* x_scale,
                const float* y_scale, Out* out) {
  auto row = [&](int64_t i) {
    const double xs = x_scale ? static_cast<double>(x_scale[i]) : 1.0;
    for (int64_t j = 0; j < n; ++j) {
      const double ys = y_scale ? static_cast<double>(y_scale[j]) : 1.0;
      out[i * n + j] = static_cast<Out>(static_cast<double>(acc[i * n + j]) * xs * ys);
    }
  };
  if (m * n >= kParallelMacs / 16) {
    parallel_for(m, row);
  } else {
    for (int64_t i = 0; i < m; ++i) row(i);
  }
}

}  // namespace

void int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                 const float* x_scale, const float* y_scale, MatmulOut out_kind, void* out) {
  if (out_kind == MatmulOut::kInt32) {
    matmul_int32(x, y, m, k, n, static_cast<int32_t*>(out));
    return;
  }
  Buffer<int32_t> acc = allocate<int32_t>(m * n);
  matmul_int32(x, y, m, k, n, acc.get());
  if (out_kind == MatmulOut::kFloat32) {
    dequantize(acc.get(), m, n, x_scale, y_scale, static_cast<float*>(out));
  } else {
    dequantize(acc.get(), m, n, x_scale, y_scale, static_cast<double*>(out));
  }
}

const char* int8_matmul_path() {
#ifdef ASICKERNELS_CPU_VNNI
  return "avx512-vnni";
#else
  return "portable";
#endif
}

}  // namespace asickernels_cpu::ASICKERNELS_CPU_ISA

#ifdef ASICKERNELS_CPU_ENTRY_POINTS
namespace asickernels_cpu::entry {
namespace {

void int8_matmul(const int8_t* x, const int8_t* y, int64_t m, int64_t k, int64_t n,
                 const float* x_scale, const float* y_scale, MatmulOut out_kind, void* out) {
  AK_DISPATCH(int8_matmul(x, y, m, k, n, x_scale, y_scale, out_kind, out));
}

const char* int8_matmul_path() { AK_DISPATCH(int8_matmul_path()); }

// x [..., M, K] @ y [..., K, N] with optional scales [..., M], [..., N] -> out [..., M, N]
// (out_count elements of out_element_bytes); leading dimensions are a batch the handler
// loops over.
ffi::Error run_matmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y, const float* x_scale,
                      size_t x_scale_count, const float* y_scale, size_t y_scale_count,
                      MatmulOut out_kind, void* out, size_t out_count, size_t out_element_bytes) {
  const auto x_dims = x.dimensions(), y_dims = y.dimensions();
  if (x_dims.size() < 2 || y_dims.size() != x_dims.size()) {
    return ffi::Error::InvalidArgument("int8_matmul: x and y must have the same rank >= 2");
  }
  const int64_t m = x_dims[x_dims.size() - 2], k = x_dims.back(), n = y_dims.back();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < x_dims.size(); ++i) batch *= x_dims[i];
  const auto count = [](int64_t value) { return static_cast<size_t>(value); };
  if (y_dims[y_dims.size() - 2] != k || y.element_count() != count(batch * k * n) ||
      out_count != count(batch * m * n) ||
      (x_scale && (x_scale_count != count(batch * m) || y_scale_count != count(batch * n)))) {
    return ffi::Error::InvalidArgument(
        "int8_matmul: x [..., M, K], y [..., K, N], scales [..., M], [..., N] -> [..., M, N]");
  }
  return ffi_guarded([&] {
    for (int64_t b = 0; b < batch; ++b) {
      int8_matmul(x.typed_data() + b * m * k, y.typed_data() + b * k * n, m, k, n,
                  x_scale ? x_scale + b * m : nullptr, y_scale ? y_scale + b * n : nullptr,
                  out_kind, static_cast<char*>(out) + b * m * n * out_element_bytes);
    }
  });
}

// The exact int32 product.
ffi::Error Int8Matmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y,
                      ffi::ResultBuffer<ffi::S32> out) {
  return run_matmul(x, y, nullptr, 0, nullptr, 0, MatmulOut::kInt32, out->typed_data(),
                    out->element_count(), sizeof(int32_t));
}

// The product dequantized with the row and column scales (float32 or float64 out).
template <ffi::DataType kOut>
ffi::Error Int8MatmulScaled(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y,
                            ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> y_scale,
                            ffi::ResultBuffer<kOut> out) {
  constexpr MatmulOut kind = kOut == ffi::F32 ? MatmulOut::kFloat32 : MatmulOut::kFloat64;
  return run_matmul(x, y, x_scale.typed_data(), x_scale.element_count(), y_scale.typed_data(),
                    y_scale.element_count(), kind, out->typed_data(), out->element_count(),
                    sizeof(Native<kOut>));
}

}  // namespace

AK_HANDLER(int8_matmul, Int8Matmul);
AK_FLOAT_HANDLER(int8_matmul_scaled, Int8MatmulScaled)

}  // namespace asickernels_cpu::entry

// "avx512-vnni" or "portable": which int8 microkernel runs here.
extern "C" const char* asickernels_cpu_int8_matmul_path() {
  return asickernels_cpu::entry::int8_matmul_path();
}
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
