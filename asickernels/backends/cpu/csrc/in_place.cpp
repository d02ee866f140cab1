// The in-place call: an XLA FFI handler whose one argument is a table of host addresses. It
// forwards its call frame to one of the library's handlers with the arrays at those
// addresses as that handler's arguments, so an eager call on the CPU reads the caller's numpy
// arrays where they are instead of XLA copying them into its own buffers (which it does for
// any array not 64-byte aligned). The caller keeps the arrays alive and unchanged until the
// call's results are ready (asickernels/backends/cpu/in_place.py).
//
// Attributes of its own, removed before forwarding (the target sees exactly the attributes
// it was bound with, in XLA's sorted order):
//   in_place_target: int64, the index of the target in AK_FFI_TARGETS;
//   in_place_layout: int64 array, per target argument: table slot, XLA_FFI_DataType, rank,
//     dimensions.
// The table: uint32 [2 * slots], each slot a host address in this machine's byte order.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "ffi_targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
#define AK_DECLARE_TARGET(name) XLA_FFI_Error* asickernels_cpu_ffi_##name(XLA_FFI_CallFrame*);
AK_FFI_TARGETS(AK_DECLARE_TARGET)
#undef AK_DECLARE_TARGET
}

namespace {

struct Target {
  const char* name;
  XLA_FFI_Handler* handler;
};

#define AK_TARGET(name) Target{#name, asickernels_cpu_ffi_##name},
constexpr Target kTargets[] = {AK_FFI_TARGETS(AK_TARGET)};
#undef AK_TARGET
constexpr int64_t kTargetCount = sizeof(kTargets) / sizeof(kTargets[0]);

constexpr std::string_view kTargetAttr = "in_place_target";
constexpr std::string_view kLayoutAttr = "in_place_layout";

XLA_FFI_Error* invalid(const XLA_FFI_Api* api, const char* message) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr, message,
                                 XLA_FFI_Error_Code_INVALID_ARGUMENT};
  return api->XLA_FFI_Error_Create(&args);
}

std::string_view name_of(const XLA_FFI_ByteSpan* name) { return {name->ptr, name->len}; }

// The product of a buffer's dimensions.
int64_t element_count(const XLA_FFI_Buffer& buffer) {
  int64_t count = 1;
  for (int64_t i = 0; i < buffer.rank; ++i) count *= buffer.dims[i];
  return count;
}

}  // namespace

extern "C" {

// The name of target i of AK_FFI_TARGETS, null past the last.
const char* asickernels_cpu_ffi_target_name(int64_t i) {
  return i >= 0 && i < kTargetCount ? kTargets[i].name : nullptr;
}

XLA_FFI_Error* asickernels_cpu_ffi_in_place(XLA_FFI_CallFrame* frame) {
  // Registration asks for the handler's metadata (API version, traits), which every target
  // built with the same header gives alike.
  if (frame->extension_start != nullptr &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    return kTargets[0].handler(frame);
  }
  const XLA_FFI_Api* api = frame->api;
  const XLA_FFI_Attrs& attrs = frame->attrs;
  int64_t target = -1;
  const XLA_FFI_Array* layout = nullptr;
  std::vector<XLA_FFI_AttrType> kept_types;
  std::vector<XLA_FFI_ByteSpan*> kept_names;
  std::vector<void*> kept_values;
  for (int64_t i = 0; i < attrs.size; ++i) {
    const std::string_view name = name_of(attrs.names[i]);
    if (name == kTargetAttr && attrs.types[i] == XLA_FFI_AttrType_SCALAR) {
      const auto* scalar = static_cast<const XLA_FFI_Scalar*>(attrs.attrs[i]);
      if (scalar->dtype == XLA_FFI_DataType_S64) {
        target = *static_cast<const int64_t*>(scalar->value);
      }
    } else if (name == kLayoutAttr && attrs.types[i] == XLA_FFI_AttrType_ARRAY) {
      layout = static_cast<const XLA_FFI_Array*>(attrs.attrs[i]);
    } else {
      kept_types.push_back(attrs.types[i]);
      kept_names.push_back(attrs.names[i]);
      kept_values.push_back(attrs.attrs[i]);
    }
  }
  if (target < 0 || target >= kTargetCount) {
    return invalid(api, "asickernels in-place call: no valid int64 in_place_target");
  }
  if (layout == nullptr || layout->dtype != XLA_FFI_DataType_S64) {
    return invalid(api, "asickernels in-place call: no int64 array in_place_layout");
  }
  if (frame->args.size != 1 || frame->args.types[0] != XLA_FFI_ArgType_BUFFER) {
    return invalid(api, "asickernels in-place call: one argument (the address table) expected");
  }
  const auto& table = *static_cast<const XLA_FFI_Buffer*>(frame->args.args[0]);
  if (table.dtype != XLA_FFI_DataType_U32 || element_count(table) % 2 != 0) {
    return invalid(api, "asickernels in-place call: the address table must be uint32 pairs");
  }
  const int64_t slots = element_count(table) / 2;

  // Parse the layout into the target's argument buffers.
  auto* spec = static_cast<int64_t*>(layout->data);
  const auto spec_size = static_cast<int64_t>(layout->size);
  std::vector<XLA_FFI_Buffer> buffers;
  for (int64_t at = 0; at < spec_size;) {
    if (at + 3 > spec_size || spec[at] < 0 || spec[at] >= slots || spec[at + 2] < 0 ||
        at + 3 + spec[at + 2] > spec_size) {
      return invalid(api, "asickernels in-place call: malformed in_place_layout");
    }
    uintptr_t address;
    std::memcpy(&address, static_cast<const char*>(table.data) + spec[at] * sizeof(uint64_t),
                sizeof(address));
    XLA_FFI_Buffer buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                          static_cast<XLA_FFI_DataType>(spec[at + 1]),
                          reinterpret_cast<void*>(address), spec[at + 2], spec + at + 3};
    if (buffer.data == nullptr && element_count(buffer) != 0) {
      return invalid(api, "asickernels in-place call: a null address for a non-empty array");
    }
    for (int64_t d = 0; d < buffer.rank; ++d) {
      if (buffer.dims[d] < 0) return invalid(api, "asickernels in-place call: negative dimension");
    }
    buffers.push_back(buffer);
    at += 3 + spec[at + 2];
  }
  std::vector<XLA_FFI_ArgType> arg_types(buffers.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<void*> args;
  for (XLA_FFI_Buffer& buffer : buffers) args.push_back(&buffer);

  XLA_FFI_CallFrame forwarded = *frame;
  forwarded.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr,
                                static_cast<int64_t>(args.size()), arg_types.data(),
                                args.data()};
  forwarded.attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr,
                                  static_cast<int64_t>(kept_values.size()), kept_types.data(),
                                  kept_names.data(), kept_values.data()};
  XLA_FFI_Error* error = kTargets[target].handler(&forwarded);
  frame->future = forwarded.future;
  return error;
}

}  // extern "C"
