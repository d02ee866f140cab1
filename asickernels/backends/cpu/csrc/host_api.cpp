// C entry points for the host (numpy) path, called through ctypes with raw pointers to
// C-contiguous arrays. dtype codes: 0 = float32, 1 = float64. Every entry point returns 0,
// or 1 for an unknown code, or 2 when the kernel failed (out of memory).
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

// The start of numpy's PyArrayObject_fields (numpy/ndarraytypes.h): PyObject_HEAD, then the
// data pointer. Python checks this against __array_interface__ before relying on it.
struct NumpyArrayHead {
  intptr_t refcount;
  const void* type;
  void* data;
};

}  // namespace

extern "C" {

// The data pointer of a numpy array given its object address (id()): ~10x cheaper from
// Python than __array_interface__ or .ctypes, which build objects on every call.
void* asickernels_cpu_numpy_data(const void* array_object) {
  return static_cast<const NumpyArrayHead*>(array_object)->data;
}

int asickernels_cpu_max_threads() { return asickernels_cpu::max_threads(); }

void asickernels_cpu_set_max_threads(int threads) { asickernels_cpu::set_max_threads(threads); }

const char* asickernels_cpu_int8_matmul_path() { return asickernels_cpu::int8_matmul_path(); }

int asickernels_cpu_sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#else
  return 0;
#endif
}

int asickernels_cpu_giou(int dtype, const void* boxes1, const void* boxes2, int64_t pairs,
                         void* out) {
  return guarded([&] {
    if (dtype == 0) {
      asickernels_cpu::giou(static_cast<const float*>(boxes1), static_cast<const float*>(boxes2),
                            pairs, static_cast<float*>(out));
    } else if (dtype == 1) {
      asickernels_cpu::giou(static_cast<const double*>(boxes1),
                            static_cast<const double*>(boxes2), pairs, static_cast<double*>(out));
    } else {
      return false;
    }
    return true;
  });
}

int asickernels_cpu_giou_vjp(int dtype, const void* boxes1, const void* boxes2,
                             const void* cotangent, int64_t pairs, void* d_boxes1,
                             void* d_boxes2) {
  return guarded([&] {
    if (dtype == 0) {
      asickernels_cpu::giou_vjp(
          static_cast<const float*>(boxes1), static_cast<const float*>(boxes2),
          static_cast<const float*>(cotangent), pairs, static_cast<float*>(d_boxes1),
          static_cast<float*>(d_boxes2));
    } else if (dtype == 1) {
      asickernels_cpu::giou_vjp(
          static_cast<const double*>(boxes1), static_cast<const double*>(boxes2),
          static_cast<const double*>(cotangent), pairs, static_cast<double*>(d_boxes1),
          static_cast<double*>(d_boxes2));
    } else {
      return false;
    }
    return true;
  });
}

// categories may be null (plain NMS).
int asickernels_cpu_nms(int dtype, const void* boxes, const void* scores,
                        const int32_t* categories, int64_t batch, int64_t n,
                        double iou_threshold, int64_t max_output_size, double score_threshold,
                        int32_t* indices, int32_t* num_valid) {
  const asickernels_cpu::NmsParams params{iou_threshold, max_output_size, score_threshold};
  return guarded([&] {
    if (dtype == 0) {
      asickernels_cpu::nms(static_cast<const float*>(boxes), static_cast<const float*>(scores),
                           categories, batch, n, params, indices, num_valid);
    } else if (dtype == 1) {
      asickernels_cpu::nms(static_cast<const double*>(boxes),
                           static_cast<const double*>(scores), categories, batch, n, params,
                           indices, num_valid);
    } else {
      return false;
    }
    return true;
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
