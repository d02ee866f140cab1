// Host shim of the GpSimd device port of <torch/torch.h>: only the subset asickernels'
// kernels use, with the device's rules checked instead of assumed.
//
//   c10::ArrayRef / IntArrayRef, c10::ScalarType (torch::kFloat, torch::kInt, ...),
//   torch::Tensor with sizes(), numel() and tcm_accessor() (read-only on a const Tensor),
//   torch::TensorTcmAccessor<read_only>::tensor_to_tcm / tcm_to_tensor,
//   torch::empty / torch::zeros (for shape functions), torch::neuron::tcm_malloc / tcm_free.
//
// Anything else a kernel uses does not compile here, as it might not on the device. The
// checks (bounds, dtypes, TCM pool, disjoint writes across cores) live in runtime.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

namespace c10 {

enum class ScalarType : int8_t { Byte, Char, Short, Int, Long, Half, Float, BFloat16 };

[[noreturn]] void shim_index_error(size_t index, size_t size);

// A non-owning view of a contiguous array, like c10::ArrayRef.
template <typename T>
class ArrayRef {
 public:
  ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
  ArrayRef(const std::vector<T>& values) : data_(values.data()), size_(values.size()) {}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  // Valid for the full expression, as in c10: `torch::zeros({rows, cols}, torch::kFloat)`.
  ArrayRef(std::initializer_list<T> values) : data_(values.begin()), size_(values.size()) {}
#pragma GCC diagnostic pop

  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  size_t size() const { return size_; }
  // Checked, unlike c10's: an out-of-range dimension is a kernel bug worth a clear error.
  const T& operator[](size_t index) const {
    if (index >= size_) shim_index_error(index, size_);
    return data_[index];
  }
  ArrayRef slice(size_t start, size_t length) const {
    if (start + length > size_) shim_index_error(start + length, size_);
    return ArrayRef(data_ + start, length);
  }
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }

 private:
  const T* data_;
  size_t size_;
};

template <typename T>
bool operator==(ArrayRef<T> a, ArrayRef<T> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

using IntArrayRef = ArrayRef<int64_t>;

// Only the dtype matters on the device, and it is required.
class TensorOptions {
 public:
  TensorOptions(ScalarType dtype) : dtype_(dtype) {}  // NOLINT: implicit, as in c10
  ScalarType dtype() const { return dtype_; }

 private:
  ScalarType dtype_;
};

}  // namespace c10

namespace asickernels_shim {

struct Storage;

// The dtype a TCM copy of T moves (a mismatch with the tensor's dtype is an error).
template <typename T>
struct DtypeOf;
#define ASICKERNELS_SHIM_DTYPE(cpp_type, scalar_type)                        \
  template <>                                                                \
  struct DtypeOf<cpp_type> {                                                 \
    static constexpr c10::ScalarType value = c10::ScalarType::scalar_type;   \
  };
ASICKERNELS_SHIM_DTYPE(float, Float)
ASICKERNELS_SHIM_DTYPE(int32_t, Int)
ASICKERNELS_SHIM_DTYPE(int64_t, Long)
ASICKERNELS_SHIM_DTYPE(int16_t, Short)
ASICKERNELS_SHIM_DTYPE(int8_t, Char)
ASICKERNELS_SHIM_DTYPE(uint8_t, Byte)
#undef ASICKERNELS_SHIM_DTYPE

// Validates and performs one TCM accessor copy (runtime.cpp).
void tcm_transfer(Storage& storage, c10::ScalarType element_type, size_t element_size,
                  void* tcm_ptr, size_t tensor_offset, size_t num_elem, bool to_tensor);

}  // namespace asickernels_shim

namespace torch {

using c10::IntArrayRef;
using c10::ScalarType;
using c10::TensorOptions;

constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kShort = ScalarType::Short;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;

// Copies between a tensor (flattened element offsets) and a tcm_malloc'd buffer. A
// read-only accessor (from a const Tensor) has no tcm_to_tensor, as on the device.
template <bool read_only>
class TensorTcmAccessor {
 public:
  explicit TensorTcmAccessor(std::shared_ptr<asickernels_shim::Storage> storage)
      : storage_(std::move(storage)) {}

  template <typename T>
  void tensor_to_tcm(T* tcm_ptr, size_t tensor_offset, size_t num_elem) {
    asickernels_shim::tcm_transfer(*storage_, asickernels_shim::DtypeOf<T>::value, sizeof(T),
                                   tcm_ptr, tensor_offset, num_elem, false);
  }

  template <typename T, bool ro = read_only, typename = std::enable_if_t<!ro>>
  void tcm_to_tensor(T* tcm_ptr, size_t tensor_offset, size_t num_elem) {
    asickernels_shim::tcm_transfer(*storage_, asickernels_shim::DtypeOf<T>::value, sizeof(T),
                                   tcm_ptr, tensor_offset, num_elem, true);
  }

 private:
  std::shared_ptr<asickernels_shim::Storage> storage_;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<asickernels_shim::Storage> storage)
      : storage_(std::move(storage)) {}

  IntArrayRef sizes() const;
  int64_t numel() const;
  ScalarType scalar_type() const;
  TensorTcmAccessor<true> tcm_accessor() const&;
  TensorTcmAccessor<false> tcm_accessor() &;

  // Shim only: the runner's view of the data.
  const std::shared_ptr<asickernels_shim::Storage>& shim_storage() const;

 private:
  std::shared_ptr<asickernels_shim::Storage> storage_;
};

// Host-side factories (shape functions): the storage is allocated on first data access.
Tensor empty(IntArrayRef size, TensorOptions options);
Tensor zeros(IntArrayRef size, TensorOptions options);

namespace neuron {
// nullptr when the core's 16 KB pool cannot hold `nbytes` more; the shim reports that as
// an error instead, since a kernel sized for the pool should never hit it.
void* tcm_malloc(size_t nbytes);
void tcm_free(void* ptr);
}  // namespace neuron

}  // namespace torch
