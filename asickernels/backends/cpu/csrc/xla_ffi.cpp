// XLA FFI handlers (jax.ffi) over the same kernels. Leading dimensions beyond the kernel's
// own are batch dimensions (what vmap's "broadcast_all" adds): GIOU flattens them into
// pairs, NMS into images, int8 matmul loops over them.
#include <cstdint>
#include <new>

#include "kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace ak = asickernels_cpu;

namespace {

template <typename Run>
ffi::Error guarded(Run&& run) {
  try {
    run();
    return ffi::Error::Success();
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "asickernels cpu: out of memory");
  }
}

template <ffi::DataType kType>
using Native = ffi::NativeType<kType>;

template <ffi::DataType kType>
ffi::Error Giou(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                ffi::ResultBuffer<kType> out) {
  return guarded([&] {
    ak::giou<Native<kType>>(boxes1.typed_data(), boxes2.typed_data(),
                            static_cast<int64_t>(boxes1.element_count() / 4), out->typed_data());
  });
}

template <ffi::DataType kType>
ffi::Error GiouVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                   ffi::Buffer<kType> cotangent, ffi::ResultBuffer<kType> d_boxes1,
                   ffi::ResultBuffer<kType> d_boxes2) {
  return guarded([&] {
    ak::giou_vjp<Native<kType>>(boxes1.typed_data(), boxes2.typed_data(),
                                cotangent.typed_data(),
                                static_cast<int64_t>(boxes1.element_count() / 4),
                                d_boxes1->typed_data(), d_boxes2->typed_data());
  });
}

// The gradient with respect to boxes1 only (boxes2 is not differentiated, e.g. targets).
template <ffi::DataType kType>
ffi::Error GiouVjpFirst(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                        ffi::Buffer<kType> cotangent, ffi::ResultBuffer<kType> d_boxes1) {
  return guarded([&] {
    ak::giou_vjp<Native<kType>>(boxes1.typed_data(), boxes2.typed_data(),
                                cotangent.typed_data(),
                                static_cast<int64_t>(boxes1.element_count() / 4),
                                d_boxes1->typed_data(), nullptr);
  });
}

template <ffi::DataType kType>
ffi::Error RunNms(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores, const int32_t* categories,
                  double iou_threshold, int64_t max_output_size, double score_threshold,
                  ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> num_valid) {
  const auto dims = scores.dimensions();
  const int64_t n = dims.size() == 0 ? 1 : dims.back();
  const int64_t batch = n == 0 ? 0 : static_cast<int64_t>(scores.element_count()) / n;
  return guarded([&] {
    ak::nms<Native<kType>>(boxes.typed_data(), scores.typed_data(), categories, batch, n,
                           ak::NmsParams{iou_threshold, max_output_size, score_threshold},
                           indices->typed_data(), num_valid->typed_data());
  });
}

template <ffi::DataType kType>
ffi::Error Nms(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores, double iou_threshold,
               int64_t max_output_size, double score_threshold,
               ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> num_valid) {
  return RunNms<kType>(boxes, scores, nullptr, iou_threshold, max_output_size, score_threshold,
                       indices, num_valid);
}

template <ffi::DataType kType>
ffi::Error NmsCategories(ffi::Buffer<kType> boxes, ffi::Buffer<kType> scores,
                         ffi::Buffer<ffi::S32> categories, double iou_threshold,
                         int64_t max_output_size, double score_threshold,
                         ffi::ResultBuffer<ffi::S32> indices,
                         ffi::ResultBuffer<ffi::S32> num_valid) {
  return RunNms<kType>(boxes, scores, categories.typed_data(), iou_threshold, max_output_size,
                       score_threshold, indices, num_valid);
}

// x [..., M, K] @ y [..., K, N] with optional scales [..., M], [..., N].
ffi::Error RunMatmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y, const float* x_scale,
                     const float* y_scale, ak::MatmulOut out_kind, void* out,
                     size_t out_element_bytes) {
  const auto x_dims = x.dimensions(), y_dims = y.dimensions();
  if (x_dims.size() < 2 || y_dims.size() != x_dims.size()) {
    return ffi::Error::InvalidArgument("int8_matmul: x and y must have the same rank >= 2");
  }
  const int64_t m = x_dims[x_dims.size() - 2], k = x_dims.back(), n = y_dims.back();
  const int64_t batch = m * k == 0 ? 1 : static_cast<int64_t>(x.element_count()) / (m * k);
  return guarded([&] {
    for (int64_t b = 0; b < batch; ++b) {
      ak::int8_matmul(x.typed_data() + b * m * k, y.typed_data() + b * k * n, m, k, n,
                      x_scale ? x_scale + b * m : nullptr, y_scale ? y_scale + b * n : nullptr,
                      out_kind, static_cast<char*>(out) + b * m * n * out_element_bytes);
    }
  });
}

ffi::Error Int8Matmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y,
                      ffi::ResultBuffer<ffi::S32> out) {
  return RunMatmul(x, y, nullptr, nullptr, ak::MatmulOut::kInt32, out->typed_data(),
                   sizeof(int32_t));
}

template <ffi::DataType kOut>
ffi::Error Int8MatmulScaled(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> y,
                            ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> y_scale,
                            ffi::ResultBuffer<kOut> out) {
  constexpr ak::MatmulOut kind =
      kOut == ffi::F32 ? ak::MatmulOut::kFloat32 : ak::MatmulOut::kFloat64;
  return RunMatmul(x, y, x_scale.typed_data(), y_scale.typed_data(), kind, out->typed_data(),
                   sizeof(Native<kOut>));
}

}  // namespace

#define AK_GIOU(name, type)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Giou<type>, ffi::Ffi::Bind()             \
                                                      .Arg<ffi::Buffer<type>>() \
                                                      .Arg<ffi::Buffer<type>>() \
                                                      .Ret<ffi::Buffer<type>>());
AK_GIOU(asickernels_cpu_ffi_giou_f32, ffi::F32)
AK_GIOU(asickernels_cpu_ffi_giou_f64, ffi::F64)

#define AK_GIOU_VJP(name, type)                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, GiouVjp<type>, \
                                ffi::Ffi::Bind()     \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Ret<ffi::Buffer<type>>() \
                                    .Ret<ffi::Buffer<type>>());
AK_GIOU_VJP(asickernels_cpu_ffi_giou_vjp_f32, ffi::F32)
AK_GIOU_VJP(asickernels_cpu_ffi_giou_vjp_f64, ffi::F64)

#define AK_GIOU_VJP_FIRST(name, type)                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, GiouVjpFirst<type>, \
                                ffi::Ffi::Bind()          \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Arg<ffi::Buffer<type>>() \
                                    .Ret<ffi::Buffer<type>>());
AK_GIOU_VJP_FIRST(asickernels_cpu_ffi_giou_vjp_first_f32, ffi::F32)
AK_GIOU_VJP_FIRST(asickernels_cpu_ffi_giou_vjp_first_f64, ffi::F64)

#define AK_NMS_ATTRS_AND_RESULTS                   \
  .Attr<double>("iou_threshold")                   \
      .Attr<int64_t>("max_output_size")            \
      .Attr<double>("score_threshold")             \
      .Ret<ffi::Buffer<ffi::S32>>()                \
      .Ret<ffi::Buffer<ffi::S32>>()

#define AK_NMS(name, type)                                                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      name, Nms<type>,                                                                   \
      ffi::Ffi::Bind().Arg<ffi::Buffer<type>>().Arg<ffi::Buffer<type>>()                 \
          AK_NMS_ATTRS_AND_RESULTS);
AK_NMS(asickernels_cpu_ffi_nms_f32, ffi::F32)
AK_NMS(asickernels_cpu_ffi_nms_f64, ffi::F64)

#define AK_NMS_CATEGORIES(name, type)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, NmsCategories<type>,                               \
                                ffi::Ffi::Bind()                                         \
                                    .Arg<ffi::Buffer<type>>()                            \
                                    .Arg<ffi::Buffer<type>>()                            \
                                    .Arg<ffi::Buffer<ffi::S32>>() AK_NMS_ATTRS_AND_RESULTS);
AK_NMS_CATEGORIES(asickernels_cpu_ffi_batched_nms_f32, ffi::F32)
AK_NMS_CATEGORIES(asickernels_cpu_ffi_batched_nms_f64, ffi::F64)

XLA_FFI_DEFINE_HANDLER_SYMBOL(asickernels_cpu_ffi_int8_matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

#define AK_MATMUL_SCALED(name, out_type)                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Int8MatmulScaled<out_type>,      \
                                ffi::Ffi::Bind()                       \
                                    .Arg<ffi::Buffer<ffi::S8>>()       \
                                    .Arg<ffi::Buffer<ffi::S8>>()       \
                                    .Arg<ffi::Buffer<ffi::F32>>()      \
                                    .Arg<ffi::Buffer<ffi::F32>>()      \
                                    .Ret<ffi::Buffer<out_type>>());
AK_MATMUL_SCALED(asickernels_cpu_ffi_int8_matmul_scaled_f32, ffi::F32)
AK_MATMUL_SCALED(asickernels_cpu_ffi_int8_matmul_scaled_f64, ffi::F64)
