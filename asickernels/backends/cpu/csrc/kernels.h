// What every op's file of the native CPU library shares. An op's file (backends/cpu/nms.cpp,
// box_iou.cpp, int8_matmul.cpp, ...: beside its Python module) holds, in this order:
//
//   1. its kernels' declarations, in every instruction-set level's namespace (AK_EVERY_LEVEL);
//   2. the kernels, in namespace asickernels_cpu::ASICKERNELS_CPU_ISA;
//   3. under #ifdef ASICKERNELS_CPU_ENTRY_POINTS: the dispatching kernels (AK_DISPATCH) and
//      its XLA FFI handlers (AK_HANDLER, AK_FLOAT_HANDLER), each kernel's one binding: its
//      typed C++ signature is the argument list, XLA infers the binding from it, and the
//      host (eager) path calls the same handler (csrc/binding.cpp), so no argument list is
//      written twice.
//
// setup.py compiles each op's file once per level (baseline, avx2, avx512 on x86-64), with
// ASICKERNELS_CPU_ISA naming the level; the baseline compile also defines
// ASICKERNELS_CPU_ENTRY_POINTS. The files in csrc/ are compiled once. A build that compiles
// every file once without those macros (the sanitizer build) gets the baseline with the
// entry points. No other file lists the ops: adding one is adding its file.
//
// Semantics are the float64 references' (asickernels/kernels/giou.py, box_iou.py, nms.py,
// int8_matmul.py, roi_align.py, roi_pool.py, linear_sum_assignment.py). Every level computes
// the same results bit for bit (no FMA contraction, no reassociation).
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
#include <initializer_list>
#include <type_traits>
#include <utility>

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

// An error naming what a buffer's dimensions should have been, or Success when `dims` are
// `want` (a handler checks the shapes it relies on before it reads or writes a byte).
ffi::Error expect_dims(const char* what, ffi::Span<const int64_t> dims,
                       std::initializer_list<int64_t> want);

// -- Bindings --------------------------------------------------------------------------------

// A handler's parameter the host path can pass: a buffer, a result, or attributes.
template <typename P>
inline constexpr bool kHostParameter =
    !std::is_void_v<typename ffi::ArgBinding<P>::Arg> ||
    !std::is_void_v<typename ffi::RetBinding<P>::Ret> ||
    !std::is_void_v<typename ffi::AttrBinding<P>::Attr> ||
    !std::is_void_v<typename ffi::AttrsBinding<P>::Attrs>;

template <typename Fn>
struct HostCallable;
template <typename... Params>
struct HostCallable<ffi::Error (*)(Params...)> {
  static constexpr bool value = (kHostParameter<Params> && ...);
};

// The first of a handler's float32 and float64 instantiations' parameters whose types
// differ: which buffer's element type picks the instantiation (an argument's, or a
// result's: index among the arguments, or among the results).
struct FloatSlot {
  bool result;
  size_t index;
};

template <typename F32, typename F64>
struct FloatSlotOf;
template <typename... A, typename... B>
struct FloatSlotOf<ffi::Error (*)(A...), ffi::Error (*)(B...)> {
  static constexpr FloatSlot value = [] {
    constexpr bool differs[] = {!std::is_same_v<A, B>..., true};
    constexpr bool result[] = {!std::is_void_v<typename ffi::RetBinding<A>::Ret>..., false};
    constexpr bool argument[] = {!std::is_void_v<typename ffi::ArgBinding<A>::Arg>..., false};
    size_t i = 0, arguments = 0, results = 0;
    for (; !differs[i]; ++i) {
      arguments += argument[i];
      results += result[i];
    }
    return FloatSlot{result[i], result[i] ? results : arguments};
  }();
  static_assert(sizeof...(A) == sizeof...(B) && !(std::is_same_v<A, B> && ...),
                "the float32 and float64 handlers must differ in a buffer's type");
};

// Runs `f32` or `f64` (two handlers of one kernel) on `frame` as the element type of the
// buffer at `slot` says: F32, F64, or an error naming the kernel.
XLA_FFI_Error* by_float_type(const char* kernel, XLA_FFI_CallFrame* frame, FloatSlot slot,
                             XLA_FFI_Handler* f32, XLA_FFI_Handler* f64);

}  // namespace asickernels_cpu::entry

// The XLA FFI handler symbol asickernels_cpu_ffi_<name> of `handler`, a function whose typed
// parameters (ffi::Buffer<...> arguments, ffi::ResultBuffer<...> results, an attributes
// struct registered with AK_ATTRIBUTES) are its binding (ffi::Ffi::BindTo). Python calls it
// by name, under jit through XLA and eagerly on the host (csrc/binding.cpp).
#define AK_HANDLER(name, handler)                                                        \
  static_assert(::asickernels_cpu::entry::HostCallable<decltype(&handler)>::value,       \
                #handler ": parameters must be buffers, results or attributes");         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(asickernels_cpu_ffi_##name, handler)

// One handler symbol asickernels_cpu_ffi_<name> for a handler template over its float type
// (template <ffi::DataType kType>): handler<ffi::F32> or handler<ffi::F64>, chosen by the
// element type of the first buffer whose type depends on it; any other type is refused.
#define AK_FLOAT_HANDLER(name, handler)                                                        \
  static_assert(::asickernels_cpu::entry::HostCallable<decltype(&handler<ffi::F32>)>::value, \
                #handler ": parameters must be buffers, results or attributes");               \
  extern "C" XLA_FFI_Error* asickernels_cpu_ffi_##name(XLA_FFI_CallFrame* frame) {            \
    XLA_FFI_DEFINE_HANDLER(f32, handler<ffi::F32>);                                            \
    XLA_FFI_DEFINE_HANDLER(f64, handler<ffi::F64>);                                            \
    constexpr auto slot = ::asickernels_cpu::entry::FloatSlotOf<                               \
        decltype(&handler<ffi::F32>), decltype(&handler<ffi::F64>)>::value;                    \
    return ::asickernels_cpu::entry::by_float_type(#name, frame, slot, f32, f64);              \
  }

// AK_ATTRIBUTES(Struct, field, ...): a handler's Struct parameter is decoded from the call's
// attributes, one per field, named as the field and of its type (a Python keyword
// iou_threshold=0.5 arrives as NmsParams::iou_threshold, a double). Every field must be
// listed, in declaration order (checked here: the struct is built from the list in order).
#define AK_ATTRIBUTES(T, ...)                                                            \
  static_assert(::asickernels_cpu::entry::lists_every_field<T>(                           \
                    {AK_FOR_EACH_(AK_OFFSET_, T, __VA_ARGS__)}),                           \
                "AK_ATTRIBUTES(" #T ", ...) must list every field, in declaration order"); \
  XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(T, AK_FOR_EACH_(AK_MEMBER_, T, __VA_ARGS__))

#define AK_MEMBER_(T, field) ::xla::ffi::StructMember<decltype(T::field)>(#field)
#define AK_OFFSET_(T, field) offsetof(T, field)
#define AK_FOR_EACH_(m, T, ...)                                                         \
  AK_PICK_(__VA_ARGS__, AK_EACH8_, AK_EACH7_, AK_EACH6_, AK_EACH5_, AK_EACH4_, AK_EACH3_, \
           AK_EACH2_, AK_EACH1_)(m, T, __VA_ARGS__)
#define AK_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, NAME, ...) NAME
#define AK_EACH1_(m, T, a) m(T, a)
#define AK_EACH2_(m, T, a, ...) m(T, a), AK_EACH1_(m, T, __VA_ARGS__)
#define AK_EACH3_(m, T, a, ...) m(T, a), AK_EACH2_(m, T, __VA_ARGS__)
#define AK_EACH4_(m, T, a, ...) m(T, a), AK_EACH3_(m, T, __VA_ARGS__)
#define AK_EACH5_(m, T, a, ...) m(T, a), AK_EACH4_(m, T, __VA_ARGS__)
#define AK_EACH6_(m, T, a, ...) m(T, a), AK_EACH5_(m, T, __VA_ARGS__)
#define AK_EACH7_(m, T, a, ...) m(T, a), AK_EACH6_(m, T, __VA_ARGS__)
#define AK_EACH8_(m, T, a, ...) m(T, a), AK_EACH7_(m, T, __VA_ARGS__)

namespace asickernels_cpu::entry {

// Converts to any field's type: T{AnyField{}...} compiles with as many as T has fields.
struct AnyField {
  template <typename U>
  operator U() const;
};

template <typename T, typename Indices, typename = void>
struct BracedFrom : std::false_type {};
template <typename T, size_t... kI>
struct BracedFrom<T, std::index_sequence<kI...>,
                  std::void_t<decltype(T{(void(kI), AnyField{})...})>> : std::true_type {};

// Whether fields at these offsets are all of T's, in declaration order: as many as T has
// (T is built from that many values, not one more), each after the one before.
template <typename T, size_t kCount>
constexpr bool lists_every_field(const size_t (&offsets)[kCount]) {
  static_assert(std::is_standard_layout_v<T> && std::is_aggregate_v<T>);
  if (!BracedFrom<T, std::make_index_sequence<kCount>>::value ||
      BracedFrom<T, std::make_index_sequence<kCount + 1>>::value) {
    return false;
  }
  for (size_t i = 1; i < kCount; ++i) {
    if (offsets[i] <= offsets[i - 1]) return false;
  }
  return true;
}

}  // namespace asickernels_cpu::entry
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
