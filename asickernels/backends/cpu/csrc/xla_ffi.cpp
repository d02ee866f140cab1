// XLA FFI handlers (jax.ffi) over the same kernels. Leading dimensions beyond the kernel's
// own are batch dimensions (what vmap's "broadcast_all" adds): paired box metrics flatten them
// into pairs, pairwise ones and NMS into images, int8 matmul loops over them.
#include <cstdint>
#include <new>

#include "ffi_targets.h"
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

// A box metric code (the "metric" attribute) as a BoxMetric, or an error.
ffi::Error box_metric(int64_t code, ak::BoxMetric& metric) {
  if (!ak::is_box_metric(code)) return ffi::Error::InvalidArgument("unknown box metric code");
  metric = static_cast<ak::BoxMetric>(code);
  return ffi::Error::Success();
}

// Paired boxes [..., 4] x2 -> [...]: leading dimensions are pairs.
template <ffi::DataType kType>
ffi::Error PairedBoxMetric(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2, int64_t code,
                           ffi::ResultBuffer<kType> out) {
  ak::BoxMetric metric;
  if (ffi::Error error = box_metric(code, metric); error.failure()) return error;
  return guarded([&] {
    ak::paired_box_metric<Native<kType>>(metric, boxes1.typed_data(), boxes2.typed_data(),
                                         static_cast<int64_t>(boxes1.element_count() / 4),
                                         out->typed_data());
  });
}

template <ffi::DataType kType>
ffi::Error RunPairedVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                        ffi::Buffer<kType> cotangent, int64_t code, Native<kType>* d_boxes1,
                        Native<kType>* d_boxes2) {
  ak::BoxMetric metric;
  if (ffi::Error error = box_metric(code, metric); error.failure()) return error;
  return guarded([&] {
    ak::paired_box_metric_vjp<Native<kType>>(
        metric, boxes1.typed_data(), boxes2.typed_data(), cotangent.typed_data(),
        static_cast<int64_t>(boxes1.element_count() / 4), d_boxes1, d_boxes2);
  });
}

template <ffi::DataType kType>
ffi::Error PairedBoxMetricVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                              ffi::Buffer<kType> cotangent, int64_t code,
                              ffi::ResultBuffer<kType> d_boxes1,
                              ffi::ResultBuffer<kType> d_boxes2) {
  return RunPairedVjp<kType>(boxes1, boxes2, cotangent, code, d_boxes1->typed_data(),
                             d_boxes2->typed_data());
}

// The gradient with respect to boxes1 only (boxes2 is not differentiated, e.g. targets).
template <ffi::DataType kType>
ffi::Error PairedBoxMetricVjpFirst(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                                   ffi::Buffer<kType> cotangent, int64_t code,
                                   ffi::ResultBuffer<kType> d_boxes1) {
  return RunPairedVjp<kType>(boxes1, boxes2, cotangent, code, d_boxes1->typed_data(), nullptr);
}

// Pairwise boxes1 [..., N, 4] x boxes2 [..., M, 4]: leading dimensions are images.
struct PairwiseShape {
  int64_t batch = 1, n = 0, m = 0;
};

template <ffi::DataType kType>
ffi::Error pairwise_shape(const ffi::Buffer<kType>& boxes1, const ffi::Buffer<kType>& boxes2,
                          PairwiseShape& shape) {
  const auto dims1 = boxes1.dimensions(), dims2 = boxes2.dimensions();
  if (dims1.size() < 2 || dims1.size() != dims2.size()) {
    return ffi::Error::InvalidArgument("pairwise box metric: boxes of one rank >= 2 expected");
  }
  for (size_t i = 0; i + 2 < dims1.size(); ++i) shape.batch *= dims1[i];
  shape.n = dims1[dims1.size() - 2], shape.m = dims2[dims2.size() - 2];
  return ffi::Error::Success();
}

// The metric and the shape of a pairwise call, or an error.
template <ffi::DataType kType>
ffi::Error pairwise_call(int64_t code, const ffi::Buffer<kType>& boxes1,
                         const ffi::Buffer<kType>& boxes2, ak::BoxMetric& metric,
                         PairwiseShape& shape) {
  if (ffi::Error error = box_metric(code, metric); error.failure()) return error;
  return pairwise_shape(boxes1, boxes2, shape);
}

template <ffi::DataType kType>
ffi::Error PairwiseBoxMetric(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2, int64_t code,
                             ffi::ResultBuffer<kType> out) {
  ak::BoxMetric metric;
  PairwiseShape shape;
  if (ffi::Error error = pairwise_call(code, boxes1, boxes2, metric, shape); error.failure()) {
    return error;
  }
  return guarded([&] {
    ak::pairwise_box_metric<Native<kType>>(metric, boxes1.typed_data(), boxes2.typed_data(),
                                           shape.batch, shape.n, shape.m, out->typed_data());
  });
}

template <ffi::DataType kType>
ffi::Error PairwiseBoxMetricVjp(ffi::Buffer<kType> boxes1, ffi::Buffer<kType> boxes2,
                                ffi::Buffer<kType> cotangent, int64_t code,
                                ffi::ResultBuffer<kType> d_boxes1,
                                ffi::ResultBuffer<kType> d_boxes2) {
  ak::BoxMetric metric;
  PairwiseShape shape;
  if (ffi::Error error = pairwise_call(code, boxes1, boxes2, metric, shape); error.failure()) {
    return error;
  }
  return guarded([&] {
    ak::pairwise_box_metric_vjp<Native<kType>>(
        metric, boxes1.typed_data(), boxes2.typed_data(), cotangent.typed_data(), shape.batch,
        shape.n, shape.m, d_boxes1->typed_data(), d_boxes2->typed_data());
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

// Box metrics: (boxes1, boxes2[, cotangent]) of one float type, the "metric" code, results.
#define AK_BOX_ARGS(type, count) AK_BOX_ARGS_##count(type).Attr<int64_t>("metric")
#define AK_BOX_ARGS_2(type) ffi::Ffi::Bind().Arg<ffi::Buffer<type>>().Arg<ffi::Buffer<type>>()
#define AK_BOX_ARGS_3(type) AK_BOX_ARGS_2(type).Arg<ffi::Buffer<type>>()
#define AK_BOX_HANDLER(name, handler, args, results)                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(asickernels_cpu_ffi_##name##_f32, handler<ffi::F32>, \
                                AK_BOX_ARGS(ffi::F32, args) results(ffi::F32)); \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(asickernels_cpu_ffi_##name##_f64, handler<ffi::F64>, \
                                AK_BOX_ARGS(ffi::F64, args) results(ffi::F64));
#define AK_ONE_RESULT(type) .Ret<ffi::Buffer<type>>()
#define AK_TWO_RESULTS(type) .Ret<ffi::Buffer<type>>().Ret<ffi::Buffer<type>>()
AK_BOX_HANDLER(paired_box_metric, PairedBoxMetric, 2, AK_ONE_RESULT)
AK_BOX_HANDLER(paired_box_metric_vjp, PairedBoxMetricVjp, 3, AK_TWO_RESULTS)
AK_BOX_HANDLER(paired_box_metric_vjp_first, PairedBoxMetricVjpFirst, 3, AK_ONE_RESULT)
AK_BOX_HANDLER(pairwise_box_metric, PairwiseBoxMetric, 2, AK_ONE_RESULT)
AK_BOX_HANDLER(pairwise_box_metric_vjp, PairwiseBoxMetricVjp, 3, AK_TWO_RESULTS)

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

#define AK_TARGET_NAME(name) #name,
constexpr const char* kTargetNames[] = {AK_FFI_TARGETS(AK_TARGET_NAME)};
#undef AK_TARGET_NAME

// The name of handler i of ffi_targets.h (without the asickernels_cpu_ffi_ prefix), null
// past the last: the list Python registers.
extern "C" const char* asickernels_cpu_ffi_target_name(int64_t i) {
  constexpr int64_t count = sizeof(kTargetNames) / sizeof(kTargetNames[0]);
  return i >= 0 && i < count ? kTargetNames[i] : nullptr;
}
