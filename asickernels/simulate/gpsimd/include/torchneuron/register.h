// Host shim of "torchneuron/register.h": NEURON_LIBRARY(lib, m) { m.def(op, &shape_fn,
// "kernel_fn"); } records each op's shape function and the name of its kernel. As in
// torch-neuronx, the op is matched to its kernel by that name, and the schema comes from the
// shape function: a shape function taking tensors by value fits a kernel taking
// `const torch::Tensor&` (custom-c++-operators-devguide "Shape Function").
#pragma once

#include <torch/torch.h>

#include "asickernels_shim/ops.hpp"

namespace asickernels_shim {

class Library {
 public:
  explicit Library(const char* name) : name_(name) {}

  template <typename... P>
  Library& def(const char* op, torch::Tensor (*shape_fn)(P...), const char* kernel_name) {
    register_op(name_, op, kernel_name, parameters_of<P...>(), invoker_of(shape_fn));
    return *this;
  }

  template <typename Fn>
  Library& def(const char*, Fn, const char*) {
    static_assert(sizeof(Fn) == 0, "m.def(op, &shape_fn, \"kernel\"): shape_fn must be a "
                                   "function returning torch::Tensor");
    return *this;
  }

 private:
  const char* name_;
};

inline int define_library(const char* name, void (*body)(Library&)) noexcept {
  Library library(name);
  body(library);
  return 0;
}

}  // namespace asickernels_shim

#define NEURON_LIBRARY(lib, m)                                                             \
  static void asickernels_shim_library_body_##lib(::asickernels_shim::Library&);           \
  __attribute__((unused)) static const int asickernels_shim_library_init_##lib =           \
      ::asickernels_shim::define_library(#lib, &asickernels_shim_library_body_##lib);      \
  static void asickernels_shim_library_body_##lib(::asickernels_shim::Library& m)
