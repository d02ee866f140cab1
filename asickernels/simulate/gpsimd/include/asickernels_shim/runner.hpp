// The host side of the shim: wraps caller buffers as tensors, sizes the output with the
// op's registered shape function, runs the kernel once per simulated GpSimd core (threads)
// and checks what the device would not: bounds, dtypes, the 16 KB TCM pool per core, TCM
// leaks, get_dst_tensor() use, and that the cores wrote disjoint slices covering the output.
// Used by the extern "C" entry points that Python calls through ctypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <typeindex>
#include <utility>
#include <vector>

#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>

#include "torchneuron/register.h"

namespace asickernels_shim {

constexpr uint32_t kCoreCount = 8;
constexpr size_t kTcmPoolBytes = 16 * 1024;

// A kernel broke a device rule, or the host glue was called with inconsistent shapes.
class ShimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor over caller-owned memory (a numpy buffer); the device's shape limits apply.
torch::Tensor wrap(void* data, c10::ScalarType dtype, std::vector<int64_t> sizes,
                   bool writable);

template <typename T>
torch::Tensor input(const T* data, std::vector<int64_t> sizes) {
  return wrap(const_cast<T*>(data), DtypeOf<T>::value, std::move(sizes), false);
}

template <typename T>
torch::Tensor output(T* data, std::vector<int64_t> sizes) {
  return wrap(data, DtypeOf<T>::value, std::move(sizes), true);
}

// The shape function NEURON_LIBRARY recorded for `op`, checked to name `kernel_name` and to
// have the kernel's signature.
ErasedFunction find_shape_function(const char* op, const char* kernel_name,
                                   std::type_index signature);

// Throws unless the shape function's result matches the output buffer the caller gave.
void check_output_shape(const char* op, const torch::Tensor& expected,
                        const torch::Tensor& dst);

// Runs `kernel` on kCoreCount threads, one per core, with `dst` as get_dst_tensor(); throws
// a ShimError listing every violation found.
void run_multicore(const torch::Tensor& dst, const std::function<void()>& kernel);

// One operator call as torch-neuronx makes it: shape function, then the kernel on all cores.
template <typename... Params, typename... Values>
void run_op(const char* op, const char* kernel_name, torch::Tensor (*kernel)(Params...),
            const torch::Tensor& dst, const Values&... values) {
  using Signature = torch::Tensor(Params...);
  auto shape_fn = reinterpret_cast<Signature*>(
      find_shape_function(op, kernel_name, std::type_index(typeid(Signature))));
  check_output_shape(op, shape_fn(values...), dst);
  run_multicore(dst, [&] { kernel(values...); });
}

void write_error(char* error, size_t error_size, const char* message) noexcept;

// For extern "C" entry points: 0 on success, else 1 with the message in `error`.
template <typename Body>
int guarded(char* error, size_t error_size, Body&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
  } catch (...) {
    write_error(error, error_size, "unknown C++ exception");
  }
  return 1;
}

}  // namespace asickernels_shim

// Counters of the most recent successful run: active cores, peak TCM bytes on one core,
// bytes copied tensor -> TCM, bytes copied TCM -> tensor.
extern "C" void asickernels_shim_last_run_stats(uint64_t* out);
// 1 when this library was built with AddressSanitizer.
extern "C" int asickernels_shim_sanitized();
