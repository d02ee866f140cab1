// The shim's operator registry, filled while a library loads: NEURON_LIBRARY's m.def(...)
// records each op's shape function, and the generated glue records every kernel function
// the compute sources define. Calls are type-erased through `Invoker`s, so any documented
// signature works (tensors by value or by reference, double, torch::Scalar).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace asickernels_shim {

// One argument of an operator call: a tensor, or a double (the only scalar dtype).
struct Argument {
  torch::Tensor tensor;  // undefined for a number
  double number = 0.0;
};

// A parameter's type without const and references. Only these three are documented
// (custom-c++-operators-devguide "Kernel Function": "When passing in scalars, double is the
// only supported dtype").
enum class ParamKind : int { Tensor = 0, Double = 1, Scalar = 2, Unsupported = 3 };

template <typename P>
using Bare = typename std::remove_cv<typename std::remove_reference<P>::type>::type;

template <typename P>
struct ParamTraits {
  static constexpr ParamKind kind = ParamKind::Unsupported;
};
template <>
struct ParamTraits<torch::Tensor> {
  static constexpr ParamKind kind = ParamKind::Tensor;
};
template <>
struct ParamTraits<double> {
  static constexpr ParamKind kind = ParamKind::Double;
};
template <>
struct ParamTraits<c10::Scalar> {
  static constexpr ParamKind kind = ParamKind::Scalar;
};

struct Parameter {
  ParamKind kind;
  std::string type_name;
};

using Invoker = std::function<torch::Tensor(std::vector<Argument>&)>;

// What an argument binds to for a parameter of kind K (by value or by reference).
template <ParamKind K>
struct Cast;
template <>
struct Cast<ParamKind::Tensor> {
  static torch::Tensor& get(Argument& argument) { return argument.tensor; }
};
template <>
struct Cast<ParamKind::Double> {
  static double& get(Argument& argument) { return argument.number; }
};
template <>
struct Cast<ParamKind::Scalar> {
  static c10::Scalar get(Argument& argument) { return c10::Scalar(argument.number); }
};

std::string demangle(const char* mangled);

template <typename... P>
std::vector<Parameter> parameters_of() {
  return {Parameter{ParamTraits<Bare<P>>::kind, demangle(typeid(P).name())}...};
}

template <typename... P>
constexpr bool all_supported() {
  const bool supported[] = {true, (ParamTraits<Bare<P>>::kind != ParamKind::Unsupported)...};
  for (bool each : supported) {
    if (!each) return false;
  }
  return true;
}

// An op with an unsupported parameter gets no invoker: loading the library refuses it.
template <bool supported>
struct MakeInvoker {
  template <typename... P, size_t... I>
  static Invoker make(torch::Tensor (*fn)(P...), std::index_sequence<I...>) {
    return [fn](std::vector<Argument>& args) {
      (void)args;
      return fn(Cast<ParamTraits<Bare<P>>::kind>::get(args[I])...);
    };
  }
};
template <>
struct MakeInvoker<false> {
  template <typename Fn, typename Indices>
  static Invoker make(Fn, Indices) {
    return nullptr;
  }
};

template <typename... P>
Invoker invoker_of(torch::Tensor (*fn)(P...)) {
  return MakeInvoker<all_supported<P...>()>::make(fn, std::index_sequence_for<P...>());
}

// runtime.cpp. Never throw: they run while the library loads; problems are reported when
// the library is checked.
void register_op(const char* library, const char* op, const char* kernel_name,
                 std::vector<Parameter> parameters, Invoker shape_fn) noexcept;
void register_kernel(const char* name, const char* signature, std::vector<Parameter> parameters,
                     Invoker kernel) noexcept;
// The -DSTACK_SIZE the library was built with (the glue passes it on).
int declare_stack_size(long long bytes) noexcept;

// Used by the generated glue, once per function the compute sources define.
template <typename... P>
int register_kernel_function(const char* name, const char* signature,
                             torch::Tensor (*kernel)(P...)) noexcept {
  register_kernel(name, signature, parameters_of<P...>(), invoker_of(kernel));
  return 0;
}

}  // namespace asickernels_shim
