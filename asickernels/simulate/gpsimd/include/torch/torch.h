// Host shim of the GpSimd device port of <torch/torch.h> (Neuron custom C++ operators), as
// documented in aws-neuron-sdk neuron-customops/api-reference-guide/custom-ops-ref-guide.rst:
//
//   dtypes kFloat kBFloat16 kHalf kInt kChar kShort kByte (kLong is declared but refused: the
//   guide dropped it, "unable to support 64-bit custom ops"); c10::ArrayRef / IntArrayRef;
//   torch::Scalar; factories empty / zeros / ones / full / eye; the element-wise ops the guide
//   lists, as op() and op_out(), without broadcasting; torch::Tensor with sizes(), size(i),
//   dim(), numel(), fill_(), accessor<T, N>(), read/write stream accessors, tcm_accessor(),
//   the accessor coherence policy; torch::neuron::tcm_malloc / tcm_free; assert.
//
// Anything else a kernel uses does not compile here, as it might not on the device. Every
// check (bounds, dtypes, the 16 KB TCM pool, accessors allowed per mode, ...) is done in
// runtime.cpp and reported as a finding of the run.
#pragma once

#include <assert.h>  // the device header brings assert: the guide's examples use it bare

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

namespace c10 {

enum class ScalarType : int8_t { Byte, Char, Short, Int, Long, Half, Float, BFloat16 };

[[noreturn]] void shim_index_error(int64_t index, int64_t size, const char* what);

// A non-owning view of a contiguous array, like c10::ArrayRef.
template <typename T>
class ArrayRef {
 public:
  ArrayRef() : data_(nullptr), size_(0) {}
  ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
  ArrayRef(const std::vector<T>& values) : data_(values.data()), size_(values.size()) {}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  // Valid for the full expression, as in c10: `torch::zeros({rows, cols}, torch::kFloat)`.
  ArrayRef(std::initializer_list<T> values) : data_(values.begin()), size_(values.size()) {}
#pragma GCC diagnostic pop

  const T* data() const { return data_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Checked, unlike c10's: an out-of-range dimension is a kernel bug worth a clear error.
  const T& operator[](size_t index) const {
    if (index >= size_) shim_index_error(static_cast<int64_t>(index), size_, "ArrayRef");
    return data_[index];
  }
  ArrayRef slice(size_t start, size_t length) const {
    if (start + length > size_) {
      shim_index_error(static_cast<int64_t>(start + length), size_, "ArrayRef::slice");
    }
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

template <typename T>
bool operator!=(ArrayRef<T> a, ArrayRef<T> b) {
  return !(a == b);
}

using IntArrayRef = ArrayRef<int64_t>;

// 16-bit floats stored as bits; arithmetic goes through float, as in c10.
struct Half {
  uint16_t x = 0;
  Half() = default;
  Half(float value);  // NOLINT: implicit, as in c10
  operator float() const;
};

struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  BFloat16(float value);  // NOLINT: implicit, as in c10
  operator float() const;
};

// A number passed to or used by the tensor library (c10::Scalar): integral or floating.
class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
  Scalar(T value) : integral_(true), long_(static_cast<int64_t>(value)),  // NOLINT
        double_(static_cast<double>(value)) {}
  template <typename T,
            typename std::enable_if<std::is_floating_point<T>::value, int>::type = 0>
  Scalar(T value) : integral_(false), long_(static_cast<int64_t>(value)),  // NOLINT
        double_(static_cast<double>(value)) {}
  Scalar(Half value) : Scalar(static_cast<float>(value)) {}      // NOLINT
  Scalar(BFloat16 value) : Scalar(static_cast<float>(value)) {}  // NOLINT

  bool isIntegral(bool /*includeBool*/) const { return integral_; }
  bool isFloatingPoint() const { return !integral_; }
  double toDouble() const { return double_; }
  float toFloat() const { return static_cast<float>(double_); }
  int64_t toLong() const { return integral_ ? long_ : static_cast<int64_t>(double_); }
  int32_t toInt() const { return static_cast<int32_t>(toLong()); }
  template <typename T>
  T to() const {
    return integral_ ? static_cast<T>(long_) : static_cast<T>(double_);
  }

 private:
  bool integral_;
  int64_t long_;
  double double_;
};

// Only the dtype matters on the device, and it must be specified.
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(ScalarType dtype) : dtype_(dtype), has_dtype_(true) {}  // NOLINT: implicit
  TensorOptions dtype(ScalarType dtype) const { return TensorOptions(dtype); }
  ScalarType dtype() const;
  bool has_dtype() const { return has_dtype_; }

 private:
  ScalarType dtype_ = ScalarType::Float;
  bool has_dtype_ = false;
};

}  // namespace c10

namespace asickernels_shim {

struct Storage;
struct Stream;

// The dtype an accessor of T reads (a mismatch with the tensor's dtype is an error).
template <typename T>
struct DtypeOf;
#define ASICKERNELS_SHIM_DTYPE(cpp_type, scalar_type)                        \
  template <>                                                                \
  struct DtypeOf<cpp_type> {                                                 \
    static constexpr c10::ScalarType value = c10::ScalarType::scalar_type;   \
  };
ASICKERNELS_SHIM_DTYPE(float, Float)
ASICKERNELS_SHIM_DTYPE(c10::Half, Half)
ASICKERNELS_SHIM_DTYPE(c10::BFloat16, BFloat16)
ASICKERNELS_SHIM_DTYPE(int32_t, Int)
ASICKERNELS_SHIM_DTYPE(int64_t, Long)
ASICKERNELS_SHIM_DTYPE(int16_t, Short)
ASICKERNELS_SHIM_DTYPE(int8_t, Char)
ASICKERNELS_SHIM_DTYPE(uint8_t, Byte)
#undef ASICKERNELS_SHIM_DTYPE

// runtime.cpp: each validates, records what the run's checks need, and throws a ShimError
// (a fatal finding for the core) when the access is invalid.
void tcm_transfer(Storage& storage, c10::ScalarType element_type, size_t element_size,
                  void* tcm_ptr, size_t tensor_offset, size_t num_elem, bool to_tensor);
// The data of `storage` for a standard accessor of `dims` dimensions; sizes/strides out.
void* open_accessor(Storage& storage, c10::ScalarType element_type, size_t dims,
                    bool writable_access, const int64_t** sizes, const int64_t** strides);
Stream* open_stream(Storage& storage, c10::ScalarType element_type, bool write);
const void* stream_read(Stream* stream);
void stream_write(Stream* stream, const void* value);
int close_stream(Stream* stream) noexcept;
void delete_stream(Stream* stream) noexcept;

struct StreamDeleter {
  void operator()(Stream* stream) const noexcept { delete_stream(stream); }
};

// What both stream accessors share: the open stream, closed on close() or destruction.
class StreamAccessor {
 public:
  explicit StreamAccessor(Stream* stream) : stream_(stream) {}
  int close() { return close_stream(stream_.get()); }

 protected:
  std::unique_ptr<Stream, StreamDeleter> stream_;
};

}  // namespace asickernels_shim

namespace torch {

using c10::BFloat16;
using c10::Half;
using c10::IntArrayRef;
using c10::Scalar;
using c10::ScalarType;
using c10::TensorOptions;

constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kShort = ScalarType::Short;
constexpr ScalarType kInt = ScalarType::Int;
// Declared so that code naming it compiles, but every kLong tensor is refused at run time:
// custom-ops-ref-guide.rst no longer lists it ("unable to support 64-bit custom ops").
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;

// What happens on potentially incoherent stream-accessor use (custom-ops-ref-guide
// "Coherence"): an error, a warning, or nothing.
class CoherencyEnforcer {
 public:
  enum Policy { COHERENT, INCOHERENT_VERBOSE, INCOHERENT_QUIET };
};

// Element-wise random access (ATen's TensorAccessor): a[i][j]... with every index checked.
template <typename T, size_t N, bool read_only>
class TensorAccessorBase {
 public:
  using Element = typename std::conditional<read_only, const T, T>::type;
  TensorAccessorBase(Element* data, const int64_t* sizes, const int64_t* strides)
      : data_(data), sizes_(sizes), strides_(strides) {}
  int64_t size(int64_t dim) const { return sizes_[checked_dim(dim)]; }
  int64_t stride(int64_t dim) const { return strides_[checked_dim(dim)]; }

 protected:
  size_t checked_dim(int64_t dim) const {
    if (dim < 0 || dim >= static_cast<int64_t>(N)) c10::shim_index_error(dim, N, "accessor dim");
    return static_cast<size_t>(dim);
  }
  Element* element_row(int64_t index) const {
    if (index < 0 || index >= sizes_[0]) c10::shim_index_error(index, sizes_[0], "accessor");
    return data_ + index * strides_[0];
  }
  Element* data_;
  const int64_t* sizes_;
  const int64_t* strides_;
};

template <typename T, size_t N, bool read_only = false>
class TensorAccessor : public TensorAccessorBase<T, N, read_only> {
  using Base = TensorAccessorBase<T, N, read_only>;

 public:
  using Base::Base;
  TensorAccessor<T, N - 1, read_only> operator[](int64_t index) const {
    return TensorAccessor<T, N - 1, read_only>(Base::element_row(index), Base::sizes_ + 1,
                                               Base::strides_ + 1);
  }
};

template <typename T, bool read_only>
class TensorAccessor<T, 1, read_only> : public TensorAccessorBase<T, 1, read_only> {
  using Base = TensorAccessorBase<T, 1, read_only>;

 public:
  using Base::Base;
  typename Base::Element& operator[](int64_t index) const { return *Base::element_row(index); }
};

// Sequential access through a 4 KB TCM cache (custom-ops-ref-guide "Streaming Accessors").
template <typename T>
class TensorReadStreamAccessor : public asickernels_shim::StreamAccessor {
 public:
  using StreamAccessor::StreamAccessor;
  T read() { return *static_cast<const T*>(asickernels_shim::stream_read(stream_.get())); }
};

// Writes reach the tensor on close() or destruction, not before (as on the device).
template <typename T>
class TensorWriteStreamAccessor : public asickernels_shim::StreamAccessor {
 public:
  using StreamAccessor::StreamAccessor;
  void write(T value) { asickernels_shim::stream_write(stream_.get(), &value); }
};

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

  template <typename T, bool ro = read_only, typename = typename std::enable_if<!ro>::type>
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

  bool defined() const { return storage_ != nullptr; }
  IntArrayRef sizes() const;
  // Negative dims count from the end, as in ATen.
  int64_t size(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  ScalarType scalar_type() const;

  template <typename T, size_t N>
  TensorAccessor<T, N, true> accessor() const& {
    return make_accessor<T, N, true>();
  }
  template <typename T, size_t N>
  TensorAccessor<T, N, false> accessor() & {
    return make_accessor<T, N, false>();
  }
  template <typename T>
  TensorReadStreamAccessor<T> read_stream_accessor() const& {
    return TensorReadStreamAccessor<T>(
        asickernels_shim::open_stream(*shim_storage(), asickernels_shim::DtypeOf<T>::value, false));
  }
  template <typename T>
  TensorWriteStreamAccessor<T> write_stream_accessor() & {
    return TensorWriteStreamAccessor<T>(
        asickernels_shim::open_stream(*shim_storage(), asickernels_shim::DtypeOf<T>::value, true));
  }
  CoherencyEnforcer::Policy get_accessor_coherence_policy() const;
  void set_accessor_coherence_policy(CoherencyEnforcer::Policy policy) const;
  TensorTcmAccessor<true> tcm_accessor() const&;
  TensorTcmAccessor<false> tcm_accessor() &;
  Tensor& fill_(const Scalar& value) const;

  // Shim only: the runner's view of the data.
  const std::shared_ptr<asickernels_shim::Storage>& shim_storage() const;

 private:
  template <typename T, size_t N, bool read_only>
  TensorAccessor<T, N, read_only> make_accessor() const {
    const int64_t* sizes;
    const int64_t* strides;
    void* data = asickernels_shim::open_accessor(
        *shim_storage(), asickernels_shim::DtypeOf<T>::value, N, !read_only, &sizes, &strides);
    return TensorAccessor<T, N, read_only>(static_cast<T*>(data), sizes, strides);
  }

  std::shared_ptr<asickernels_shim::Storage> storage_;
};

// Factories. Memory is allocated on first data access: a shape function only reads shapes.
Tensor empty(IntArrayRef size, TensorOptions options);
Tensor zeros(IntArrayRef size, TensorOptions options);
Tensor ones(IntArrayRef size, TensorOptions options);
Tensor full(IntArrayRef size, const Scalar& fill_value, TensorOptions options);
Tensor eye(int64_t n, int64_t m, TensorOptions options);

// The documented tensor operations (custom-ops-ref-guide "Tensor Operation Functions"): no
// broadcasting; op() allocates its result (the dtype of the first tensor operand), op_out()
// writes into `result`, whose shape must match.
#define ASICKERNELS_SHIM_UNARY(name)                        \
  Tensor& name##_out(Tensor& result, const Tensor& self);   \
  Tensor name(const Tensor& self);
ASICKERNELS_SHIM_UNARY(abs)
ASICKERNELS_SHIM_UNARY(ceil)
ASICKERNELS_SHIM_UNARY(floor)
ASICKERNELS_SHIM_UNARY(sin)
ASICKERNELS_SHIM_UNARY(cos)
ASICKERNELS_SHIM_UNARY(tan)
ASICKERNELS_SHIM_UNARY(log)
ASICKERNELS_SHIM_UNARY(log2)
ASICKERNELS_SHIM_UNARY(log10)
ASICKERNELS_SHIM_UNARY(exp)
ASICKERNELS_SHIM_UNARY(bitwise_not)
#undef ASICKERNELS_SHIM_UNARY
// The guide also lists this two-argument form.
Tensor bitwise_not(Tensor& result, const Tensor& self);

#define ASICKERNELS_SHIM_BINARY(name, ...)                                                \
  Tensor& name##_out(Tensor& result, const Tensor& self, const Tensor& other __VA_ARGS__); \
  Tensor& name##_out(Tensor& result, const Tensor& self, const Scalar& other __VA_ARGS__); \
  Tensor name(const Tensor& self, const Tensor& other __VA_ARGS__);                       \
  Tensor name(const Tensor& self, const Scalar& other __VA_ARGS__);
ASICKERNELS_SHIM_BINARY(add, , const Scalar& alpha = 1)
ASICKERNELS_SHIM_BINARY(sub, , const Scalar& alpha = 1)
ASICKERNELS_SHIM_BINARY(mul)
ASICKERNELS_SHIM_BINARY(div)
ASICKERNELS_SHIM_BINARY(pow)
ASICKERNELS_SHIM_BINARY(bitwise_and)
ASICKERNELS_SHIM_BINARY(bitwise_or)
#undef ASICKERNELS_SHIM_BINARY
Tensor& pow_out(Tensor& result, const Scalar& self, const Tensor& exponent);
Tensor pow(const Scalar& self, const Tensor& exponent);
Tensor& bitwise_and_out(Tensor& result, const Scalar& self, const Tensor& other);
Tensor bitwise_and(const Scalar& self, const Tensor& other);
Tensor& bitwise_or_out(Tensor& result, const Scalar& self, const Tensor& other);
Tensor bitwise_or(const Scalar& self, const Tensor& other);
Tensor& clamp_out(Tensor& result, const Tensor& self, const Scalar& minval, const Scalar& maxval);
Tensor clamp(const Tensor& self, const Scalar& minval, const Scalar& maxval);

namespace neuron {
// Allocates from this core's 16 KB TCM pool; nullptr when it cannot hold `nbytes` more.
void* tcm_malloc(size_t nbytes);
void tcm_free(void* ptr);
}  // namespace neuron

}  // namespace torch
