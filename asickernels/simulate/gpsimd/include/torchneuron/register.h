// Host shim of "torchneuron/register.h": NEURON_LIBRARY(lib, m) { m.def(op, &shape_fn,
// "kernel_fn"); } records each op's shape function, which the shim's runner calls to size
// the output exactly as torch-neuronx does at trace time.
#pragma once

#include <typeindex>
#include <typeinfo>

#include <torch/torch.h>

namespace asickernels_shim {

using ErasedFunction = void (*)();

// Records one op (runtime.cpp). Never throws: it runs while the library loads, so
// conflicts are reported when the op is called.
void register_shape_function(const char* library, const char* op, const char* kernel_name,
                             std::type_index signature, ErasedFunction shape_fn) noexcept;

class Library {
 public:
  explicit Library(const char* name) : name_(name) {}

  template <typename Fn>
  Library& def(const char* op, Fn* shape_fn, const char* kernel_name) {
    register_shape_function(name_, op, kernel_name, std::type_index(typeid(Fn)),
                            reinterpret_cast<ErasedFunction>(shape_fn));
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
