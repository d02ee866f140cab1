// Each kernel's one binding, its XLA FFI handler, called two ways: by XLA under jax.jit (the
// call frame is XLA's), and here for eager calls on numpy arrays (asickernels_cpu_call: the
// call frame is built from what Python packed, and this file is the XLA FFI API the handler
// reports errors through). The handler decodes and checks both frames alike: argument and
// result counts, element types, attribute names and types (xla/ffi/api/api.h, ffi.h).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "kernels.h"

// The host path's error (the C API declares the type, each implementation defines it).
struct XLA_FFI_Error {
  XLA_FFI_Error_Code code;
  std::string message;
};

namespace asickernels_cpu::entry {
namespace {

XLA_FFI_Error* create_error(XLA_FFI_Error_Create_Args* args) {
  return new XLA_FFI_Error{args->errc, args->message};
}

void error_message(XLA_FFI_Error_GetMessage_Args* args) {
  args->message = args->error->message.c_str();
}

void destroy_error(XLA_FFI_Error_Destroy_Args* args) { delete args->error; }

// What a handler reaches of the API on the host: errors. Handlers take no execution context
// (AK_HANDLER checks), so they call nothing else.
const XLA_FFI_Api* host_api() {
  static const XLA_FFI_Api api = [] {
    XLA_FFI_Api value{};
    value.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    value.api_version = {XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR,
                         XLA_FFI_API_MINOR};
    value.XLA_FFI_Error_Create = create_error;
    value.XLA_FFI_Error_GetMessage = error_message;
    value.XLA_FFI_Error_Destroy = destroy_error;
    return value;
  }();
  return &api;
}

// An error made through the frame's API (XLA's, or the host's), as handlers make theirs.
XLA_FFI_Error* invalid_argument(XLA_FFI_CallFrame* frame, const std::string& message) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr,
                                 message.c_str(), XLA_FFI_Error_Code_INVALID_ARGUMENT};
  return frame->api->XLA_FFI_Error_Create(&args);
}

// The last host call's error on this thread ("" after a successful call).
thread_local std::string last_error;

// Most arrays (arguments and results) and attributes one host call takes.
constexpr int64_t kMaxArrays = 16, kMaxAttributes = 16;

}  // namespace

ffi::Error expect_dims(const char* what, ffi::Span<const int64_t> dims,
                       std::initializer_list<int64_t> want) {
  if (std::equal(dims.begin(), dims.end(), want.begin(), want.end())) {
    return ffi::Error::Success();
  }
  std::ostringstream message;
  message << what << ": shape [";
  for (size_t i = 0; i < dims.size(); ++i) message << (i ? ", " : "") << dims[i];
  message << "], expected [";
  for (auto it = want.begin(); it != want.end(); ++it) {
    message << (it != want.begin() ? ", " : "") << *it;
  }
  message << "]";
  return ffi::Error::InvalidArgument(message.str());
}

XLA_FFI_Error* by_float_type(const char* kernel, XLA_FFI_CallFrame* frame, FloatSlot slot,
                             XLA_FFI_Handler* f32, XLA_FFI_Handler* f64) {
  const int64_t count = slot.result ? frame->rets.size : frame->args.size;
  if (frame->stage == XLA_FFI_ExecutionStage_EXECUTE && static_cast<int64_t>(slot.index) < count) {
    void* buffer = slot.result ? frame->rets.rets[slot.index] : frame->args.args[slot.index];
    switch (static_cast<XLA_FFI_Buffer*>(buffer)->dtype) {
      case XLA_FFI_DataType_F32:
        return f32(frame);
      case XLA_FFI_DataType_F64:
        return f64(frame);
      default: {
        std::ostringstream message;
        message << kernel << ": float32 or float64 expected, got "
                << static_cast<ffi::DataType>(static_cast<XLA_FFI_Buffer*>(buffer)->dtype);
        return invalid_argument(frame, message.str());
      }
    }
  }
  return f32(frame);  // metadata queries and malformed frames: its own checks answer
}

}  // namespace asickernels_cpu::entry

extern "C" {

// Runs handler on a call frame packed by Python (asickernels/backends/cpu/_library.py's
// call) as 64-bit words:
//   argument count, result count, attribute count;
//   per array (the arguments, then the results): XLA element type, data address, rank,
//   then the dimensions;
//   per attribute, sorted by name: name address, name length, kind (XLA_FFI_AttrType), then
//   SCALAR: XLA element type, the value in the word's first bytes; STRING: address, length;
//   ARRAY: XLA element type (S64), element count, the values.
// Returns 0, or the XLA_FFI_Error_Code of the handler's error (asickernels_cpu_call_error
// has its message).
int asickernels_cpu_call(XLA_FFI_Handler* handler, int64_t* words) {
  using namespace asickernels_cpu::entry;
  const int64_t num_args = words[0], num_rets = words[1], num_attrs = words[2];
  if (num_args < 0 || num_rets < 0 || num_args + num_rets > kMaxArrays || num_attrs < 0 ||
      num_attrs > kMaxAttributes) {
    last_error = "asickernels_cpu_call: too many arrays or attributes";
    return XLA_FFI_Error_Code_INVALID_ARGUMENT;
  }
  int64_t* word = words + 3;
  XLA_FFI_Buffer buffers[kMaxArrays];
  void* buffer_pointers[kMaxArrays];
  XLA_FFI_ArgType arg_types[kMaxArrays];
  XLA_FFI_RetType ret_types[kMaxArrays];
  for (int64_t i = 0; i < num_args + num_rets; ++i) {
    const int64_t rank = word[2];
    buffers[i] = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, static_cast<XLA_FFI_DataType>(word[0]),
                  reinterpret_cast<void*>(word[1]), rank, word + 3};
    buffer_pointers[i] = &buffers[i];
    arg_types[i] = XLA_FFI_ArgType_BUFFER;
    ret_types[i] = XLA_FFI_RetType_BUFFER;
    word += 3 + rank;
  }
  XLA_FFI_AttrType attr_types[kMaxAttributes];
  XLA_FFI_ByteSpan names[kMaxAttributes];
  XLA_FFI_ByteSpan* name_pointers[kMaxAttributes];
  XLA_FFI_Scalar scalars[kMaxAttributes];
  XLA_FFI_ByteSpan strings[kMaxAttributes];
  XLA_FFI_Array arrays[kMaxAttributes];
  void* attr_pointers[kMaxAttributes];
  for (int64_t i = 0; i < num_attrs; ++i) {
    names[i] = {reinterpret_cast<const char*>(word[0]), static_cast<size_t>(word[1])};
    name_pointers[i] = &names[i];
    attr_types[i] = static_cast<XLA_FFI_AttrType>(word[2]);
    switch (attr_types[i]) {
      case XLA_FFI_AttrType_SCALAR:
        scalars[i] = {static_cast<XLA_FFI_DataType>(word[3]), word + 4};
        attr_pointers[i] = &scalars[i];
        word += 5;
        break;
      case XLA_FFI_AttrType_STRING:
        strings[i] = {reinterpret_cast<const char*>(word[3]), static_cast<size_t>(word[4])};
        attr_pointers[i] = &strings[i];
        word += 5;
        break;
      case XLA_FFI_AttrType_ARRAY:  // its values follow, inline
        arrays[i] = {static_cast<XLA_FFI_DataType>(word[3]), static_cast<size_t>(word[4]),
                     word + 5};
        attr_pointers[i] = &arrays[i];
        word += 5 + word[4];
        break;
      default:
        last_error = "asickernels_cpu_call: unknown attribute kind";
        return XLA_FFI_Error_Code_INVALID_ARGUMENT;
    }
  }
  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.api = host_api();
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, num_args, arg_types, buffer_pointers};
  frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, num_rets, ret_types,
                buffer_pointers + num_args};
  frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, num_attrs, attr_types, name_pointers,
                 attr_pointers};
  XLA_FFI_Error* error = handler(&frame);
  if (error == nullptr) return 0;
  last_error = std::move(error->message);
  const int code = error->code;
  delete error;
  return code;
}

const char* asickernels_cpu_call_error() { return asickernels_cpu::entry::last_error.c_str(); }

// The XLA element type of a numpy dtype name ("float32", "int8", "bool", ...), or -1.
int asickernels_cpu_element_type(const char* numpy_name) {
  static constexpr struct {
    const char* name;
    XLA_FFI_DataType type;
  } kTypes[] = {
      {"bool", XLA_FFI_DataType_PRED},   {"int8", XLA_FFI_DataType_S8},
      {"int16", XLA_FFI_DataType_S16},   {"int32", XLA_FFI_DataType_S32},
      {"int64", XLA_FFI_DataType_S64},   {"uint8", XLA_FFI_DataType_U8},
      {"uint16", XLA_FFI_DataType_U16},  {"uint32", XLA_FFI_DataType_U32},
      {"uint64", XLA_FFI_DataType_U64},  {"float16", XLA_FFI_DataType_F16},
      {"bfloat16", XLA_FFI_DataType_BF16}, {"float32", XLA_FFI_DataType_F32},
      {"float64", XLA_FFI_DataType_F64},
  };
  for (const auto& entry : kTypes) {
    if (std::strcmp(entry.name, numpy_name) == 0) return entry.type;
  }
  return -1;
}

}  // extern "C"
