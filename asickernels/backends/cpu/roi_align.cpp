// RoI pooling: RoIAlign (torchvision.ops.roi_align) and RoIPool (torchvision.ops.roi_pool)
// with their gradients: the kernels and their XLA FFI handlers, in one file compiled once
// (not per instruction-set level: the kernels gather and do not vectorize).
//
// RoIPool is torchvision's ops/cpu/roi_pool_kernel.cpp: each bin's first maximum in
// row-major order (NaN never wins; -FLT_MAX where nothing exceeds it, 0 for an empty bin),
// its gradient added at that pixel, RoI by RoI in torchvision's order.
//
// RoIAlign's arithmetic is torchvision's CPU kernel's (ops/cpu/roi_align_kernel.cpp and
// roi_align_common.h at v0.24), expression for expression, in T (float or double): same
// sample positions, same bilinear weights, same summation order, so float32 results equal
// torchvision's bit for bit (the build disables FMA contraction, as torchvision's baseline
// x86-64 build has none). A sample farther than one pixel outside the map contributes
// 0 * input[0], as there. The forward pass spreads RoIs over threads (outputs are disjoint);
// the gradient spreads channels (disjoint slices of d_input) and adds into each slice in
// torchvision's order, so it is deterministic and equal to torchvision's serial loop.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "csrc/kernels.h"

// Compiled once, at the baseline level (no vector code to gain from the others).
#ifdef ASICKERNELS_CPU_ENTRY_POINTS

namespace asickernels_cpu {
namespace {

struct RoiShape {
  int64_t batch, channels, height, width, rois, pooled_height, pooled_width;
};

struct RoiAlignParams {
  double spatial_scale;
  int64_t sampling_ratio;  // <= 0: adaptive, ceil(roi size / pooled size) per bin side
  bool aligned;
};

// One bilinear sample: four offsets into an H x W plane and their weights; outside (farther
// than a pixel off the map), offsets and weights 0, which the gradient skips.
template <typename T>
struct Sample {
  int64_t pos1, pos2, pos3, pos4;
  T w1, w2, w3, w4;
  bool inside;
};

// One RoI's sampling: its image, the samples of every bin (bin-major, then iy, ix), their
// number per bin and torchvision's grid size (grid_h * grid_w: negative sides possible with
// aligned=True), as roi_align_forward_kernel_impl and pre_calc_for_bilinear_interpolate.
template <typename T>
struct RoiSampling {
  int64_t image;
  int64_t grid_h, grid_w, per_bin;

  RoiSampling(const T* roi, const RoiShape& s, const RoiAlignParams& p,
              std::vector<Sample<T>>& samples) {
    image = static_cast<int64_t>(roi[0]);
    const T scale = static_cast<T>(p.spatial_scale);
    const T offset = p.aligned ? (T)0.5 : (T)0.0;
    const T roi_start_w = roi[1] * scale - offset;
    const T roi_start_h = roi[2] * scale - offset;
    const T roi_end_w = roi[3] * scale - offset;
    const T roi_end_h = roi[4] * scale - offset;
    if (!(std::isfinite(roi_start_w) && std::isfinite(roi_start_h) && std::isfinite(roi_end_w) &&
          std::isfinite(roi_end_h))) {  // a RoI with a NaN or infinite corner pools to 0
      grid_h = grid_w = per_bin = 0;
      samples.clear();
      return;
    }
    T roi_width = roi_end_w - roi_start_w;
    T roi_height = roi_end_h - roi_start_h;
    if (!p.aligned) {  // malformed RoIs are forced to 1x1
      roi_width = std::max(roi_width, (T)1.);
      roi_height = std::max(roi_height, (T)1.);
    }
    const int pooled_height = static_cast<int>(s.pooled_height);
    const int pooled_width = static_cast<int>(s.pooled_width);
    const T bin_size_h = static_cast<T>(roi_height) / static_cast<T>(pooled_height);
    const T bin_size_w = static_cast<T>(roi_width) / static_cast<T>(pooled_width);
    const int ratio = static_cast<int>(p.sampling_ratio);
    const int roi_bin_grid_h =
        ratio > 0 ? ratio : static_cast<int>(std::ceil(roi_height / pooled_height));
    const int roi_bin_grid_w =
        ratio > 0 ? ratio : static_cast<int>(std::ceil(roi_width / pooled_width));
    grid_h = roi_bin_grid_h, grid_w = roi_bin_grid_w;
    per_bin = std::max<int64_t>(grid_h, 0) * std::max<int64_t>(grid_w, 0);
    samples.resize(static_cast<size_t>(per_bin * pooled_height * pooled_width));
    const int height = static_cast<int>(s.height), width = static_cast<int>(s.width);
    size_t index = 0;
    for (int ph = 0; ph < pooled_height; ph++) {
      for (int pw = 0; pw < pooled_width; pw++) {
        for (int iy = 0; iy < roi_bin_grid_h; iy++) {
          const T yy = roi_start_h + ph * bin_size_h +
                       static_cast<T>(iy + .5f) * bin_size_h / static_cast<T>(roi_bin_grid_h);
          for (int ix = 0; ix < roi_bin_grid_w; ix++) {
            const T xx = roi_start_w + pw * bin_size_w +
                         static_cast<T>(ix + .5f) * bin_size_w / static_cast<T>(roi_bin_grid_w);
            samples[index++] = bilinear(yy, xx, height, width);
          }
        }
      }
    }
  }

  static Sample<T> bilinear(T y, T x, int height, int width) {
    if (y < -1.0 || y > height || x < -1.0 || x > width) return Sample<T>{0, 0, 0, 0, 0, 0, 0, 0, false};
    if (y <= 0) y = 0;
    if (x <= 0) x = 0;
    int y_low = static_cast<int>(y), x_low = static_cast<int>(x), y_high, x_high;
    if (y_low >= height - 1) {
      y_high = y_low = height - 1;
      y = (T)y_low;
    } else {
      y_high = y_low + 1;
    }
    if (x_low >= width - 1) {
      x_high = x_low = width - 1;
      x = (T)x_low;
    } else {
      x_high = x_low + 1;
    }
    const T ly = y - y_low, lx = x - x_low;
    const T hy = 1. - ly, hx = 1. - lx;
    return Sample<T>{int64_t{y_low} * width + x_low,  int64_t{y_low} * width + x_high,
                     int64_t{y_high} * width + x_low, int64_t{y_high} * width + x_high,
                     hy * hx, hy * lx, ly * hx, ly * lx, true};
  }
};

// Whether every RoI names an image of the batch (its index truncates into [0, batch)).
template <typename T>
bool batch_indices_valid(const T* rois, const RoiShape& s) {
  for (int64_t k = 0; k < s.rois; ++k) {
    const T index = rois[5 * k];
    if (!(index > -1 && index < static_cast<T>(s.batch))) return false;
  }
  return true;
}

// input [N, C, H, W], rois [K, 5] -> out [K, C, PH, PW]; false (nothing written) when a RoI
// names no image of the batch.
template <typename T>
bool roi_align(const T* input, const T* rois, const RoiShape& s, const RoiAlignParams& p,
               T* out) {
  if (!batch_indices_valid(rois, s)) return false;
  const int64_t plane = s.height * s.width, bins = s.pooled_height * s.pooled_width;
  parallel_for(s.rois, [&](int64_t k) {
    thread_local std::vector<Sample<T>> samples;
    const RoiSampling<T> roi(rois + 5 * k, s, p, samples);
    const T count = static_cast<T>(std::max<int64_t>(roi.grid_h * roi.grid_w, 1));
    for (int64_t c = 0; c < s.channels; c++) {
      const T* in = input + (roi.image * s.channels + c) * plane;
      T* bin_out = out + (k * s.channels + c) * bins;
      const Sample<T>* sample = samples.data();
      for (int64_t bin = 0; bin < bins; bin++) {
        T output_val = 0.;
        for (int64_t i = 0; i < roi.per_bin; i++, sample++) {
          output_val += sample->w1 * in[sample->pos1] + sample->w2 * in[sample->pos2] +
                        sample->w3 * in[sample->pos3] + sample->w4 * in[sample->pos4];
        }
        output_val /= count;
        bin_out[bin] = output_val;
      }
    }
  });
  return true;
}

// rois [K, 5], cotangent [K, C, PH, PW] -> d_input [N, C, H, W] (torchvision's
// roi_align_backward_kernel_impl); false (nothing written) when a RoI names no image.
template <typename T>
bool roi_align_vjp(const T* rois, const T* cotangent, const RoiShape& s,
                   const RoiAlignParams& p, T* d_input) {
  if (!batch_indices_valid(rois, s)) return false;
  const int64_t plane = s.height * s.width, bins = s.pooled_height * s.pooled_width;
  std::fill(d_input, d_input + s.batch * s.channels * plane, T(0));
  // Channels in contiguous chunks, one per thread; each chunk visits every RoI.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(s.channels, max_threads()));
  parallel_for(chunks, [&](int64_t chunk) {
    const int64_t first = chunk * s.channels / chunks, last = (chunk + 1) * s.channels / chunks;
    thread_local std::vector<Sample<T>> samples;
    for (int64_t k = 0; k < s.rois; k++) {
      const RoiSampling<T> roi(rois + 5 * k, s, p, samples);
      const T count = static_cast<T>(roi.grid_h * roi.grid_w);  // torchvision's (no max)
      for (int64_t c = first; c < last; c++) {
        T* grad = d_input + (roi.image * s.channels + c) * plane;
        const T* bin_grad = cotangent + (k * s.channels + c) * bins;
        const Sample<T>* sample = samples.data();
        for (int64_t bin = 0; bin < bins; bin++) {
          const T grad_output_this_bin = bin_grad[bin];
          for (int64_t i = 0; i < roi.per_bin; i++, sample++) {
            if (!sample->inside) continue;
            grad[sample->pos1] += grad_output_this_bin * sample->w1 / count;
            grad[sample->pos2] += grad_output_this_bin * sample->w2 / count;
            grad[sample->pos3] += grad_output_this_bin * sample->w3 / count;
            grad[sample->pos4] += grad_output_this_bin * sample->w4 / count;
          }
        }
      }
    }
  });
  return true;
}

// One RoIPool bin: its clipped pixel rows [h0, h1) and columns [w0, w1).
struct PoolBin {
  int h0, h1, w0, w1;
};

// torchvision's bins of one RoI (roi_pool_forward_kernel_impl), row-major.
template <typename T>
int64_t pool_bins(const T* roi, const RoiShape& s, T scale, std::vector<PoolBin>& bins) {
  bins.clear();
  if (!(std::isfinite(roi[1] * scale) && std::isfinite(roi[2] * scale) &&
        std::isfinite(roi[3] * scale) && std::isfinite(roi[4] * scale))) {
    bins.resize(static_cast<size_t>(s.pooled_height * s.pooled_width), PoolBin{0, 0, 0, 0});
    return static_cast<int64_t>(roi[0]);  // a RoI with a NaN or infinite corner pools to 0
  }
  const int roi_start_w = static_cast<int>(std::round(roi[1] * scale));
  const int roi_start_h = static_cast<int>(std::round(roi[2] * scale));
  const int roi_end_w = static_cast<int>(std::round(roi[3] * scale));
  const int roi_end_h = static_cast<int>(std::round(roi[4] * scale));
  const int roi_width = std::max(roi_end_w - roi_start_w + 1, 1);  // malformed: 1x1
  const int roi_height = std::max(roi_end_h - roi_start_h + 1, 1);
  const T bin_size_h = static_cast<T>(roi_height) / static_cast<T>(s.pooled_height);
  const T bin_size_w = static_cast<T>(roi_width) / static_cast<T>(s.pooled_width);
  const int height = static_cast<int>(s.height), width = static_cast<int>(s.width);
  for (int ph = 0; ph < s.pooled_height; ++ph) {
    for (int pw = 0; pw < s.pooled_width; ++pw) {
      int hstart = static_cast<int>(std::floor(static_cast<T>(ph) * bin_size_h));
      int wstart = static_cast<int>(std::floor(static_cast<T>(pw) * bin_size_w));
      int hend = static_cast<int>(std::ceil(static_cast<T>(ph + 1) * bin_size_h));
      int wend = static_cast<int>(std::ceil(static_cast<T>(pw + 1) * bin_size_w));
      hstart = std::min(std::max(hstart + roi_start_h, 0), height);
      hend = std::min(std::max(hend + roi_start_h, 0), height);
      wstart = std::min(std::max(wstart + roi_start_w, 0), width);
      wend = std::min(std::max(wend + roi_start_w, 0), width);
      bins.push_back({hstart, hend, wstart, wend});
    }
  }
  return static_cast<int64_t>(roi[0]);
}

// input [N, C, H, W], rois [K, 5] -> out [K, C, PH, PW] and, unless null, argmax (the flat
// pixel h * W + w of each bin's maximum, -1 for none); false when a RoI names no image.
template <typename T>
bool roi_pool(const T* input, const T* rois, const RoiShape& s, double spatial_scale, T* out,
              int32_t* argmax) {
  if (!batch_indices_valid(rois, s)) return false;
  const int64_t plane = s.height * s.width, pooled = s.pooled_height * s.pooled_width;
  parallel_for(s.rois, [&](int64_t k) {
    thread_local std::vector<PoolBin> bins;
    const int64_t image = pool_bins(rois + 5 * k, s, static_cast<T>(spatial_scale), bins);
    for (int64_t c = 0; c < s.channels; ++c) {
      const T* in = input + (image * s.channels + c) * plane;
      const int64_t at = (k * s.channels + c) * pooled;
      for (int64_t bin = 0; bin < pooled; ++bin) {
        const PoolBin& b = bins[bin];
        const bool is_empty = (b.h1 <= b.h0) || (b.w1 <= b.w0);
        T maxval = is_empty ? 0 : -FLT_MAX;
        int32_t maxidx = -1;
        for (int h = b.h0; h < b.h1; ++h) {
          for (int w = b.w0; w < b.w1; ++w) {
            const int32_t index = h * static_cast<int32_t>(s.width) + w;
            if (in[index] > maxval) {
              maxval = in[index];
              maxidx = index;
            }
          }
        }
        out[at + bin] = maxval;
        if (argmax != nullptr) argmax[at + bin] = maxidx;
      }
    }
  });
  return true;
}

// input [N, C, H, W] (its argmaxes), rois [K, 5], cotangent [K, C, PH, PW] -> d_input
// [N, C, H, W]: each bin's cotangent added at its argmax, RoI by RoI (torchvision's order);
// false when a RoI names no image.
template <typename T>
bool roi_pool_vjp(const T* input, const T* rois, const T* cotangent, const RoiShape& s,
                  double spatial_scale, T* d_input) {
  const int64_t plane = s.height * s.width, pooled = s.pooled_height * s.pooled_width;
  std::vector<T> unused(static_cast<size_t>(s.rois * s.channels * pooled));
  std::vector<int32_t> argmax(unused.size());
  if (!roi_pool(input, rois, s, spatial_scale, unused.data(), argmax.data())) return false;
  std::fill(d_input, d_input + s.batch * s.channels * plane, T(0));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(s.channels, max_threads()));
  parallel_for(chunks, [&](int64_t chunk) {
    const int64_t first = chunk * s.channels / chunks, last = (chunk + 1) * s.channels / chunks;
    for (int64_t k = 0; k < s.rois; ++k) {
      const int64_t image = static_cast<int64_t>(rois[5 * k]);
      for (int64_t c = first; c < last; ++c) {
        T* grad = d_input + (image * s.channels + c) * plane;
        const int64_t at = (k * s.channels + c) * pooled;
        for (int64_t bin = 0; bin < pooled; ++bin) {
          if (argmax[at + bin] != -1) grad[argmax[at + bin]] += cotangent[at + bin];
        }
      }
    }
  });
  return true;
}

}  // namespace
}  // namespace asickernels_cpu

// -- XLA FFI handlers ----------------------------------------------------------------------

namespace asickernels_cpu::entry {

// RoIPool's statics, as the op's keywords name them: output_size (pooled height, width),
// spatial_scale.
struct RoiPoolAttributes {
  ffi::Span<const int64_t> output_size;
  double spatial_scale;
};

// RoIAlign's: RoIPool's and sampling_ratio, aligned.
struct RoiAlignAttributes {
  ffi::Span<const int64_t> output_size;
  double spatial_scale;
  int64_t sampling_ratio;
  bool aligned;
};

}  // namespace asickernels_cpu::entry

AK_ATTRIBUTES(asickernels_cpu::entry::RoiPoolAttributes, output_size, spatial_scale);
AK_ATTRIBUTES(asickernels_cpu::entry::RoiAlignAttributes, output_size, spatial_scale,
              sampling_ratio, aligned);

namespace asickernels_cpu::entry {
namespace {

// Runs `run(shape)` (false: a RoI names no image) once the call's shape checks out:
// features [N, C, H, W] (the input, or the gradient's result), rois [K, 5], output_size
// (PH, PW) and `pooled` (the output or the cotangent) [K, C, PH, PW]; else the error naming
// what is not.
template <ffi::DataType kType, typename Run>
ffi::Error run_roi(ffi::Span<const int64_t> features, const ffi::Buffer<kType>& rois,
                   ffi::Span<const int64_t> output_size, ffi::Span<const int64_t> pooled,
                   Run&& run) {
  const auto rois_dims = rois.dimensions();
  if (features.size() != 4 || rois_dims.size() != 2 || rois_dims[1] != 5 ||
      output_size.size() != 2 || output_size[0] <= 0 || output_size[1] <= 0) {
    return ffi::Error::InvalidArgument(
        "RoI pooling: input [N, C, H, W], rois [K, 5] and output_size (PH, PW) expected");
  }
  const RoiShape shape{features[0], features[1],    features[2],   features[3],
                       rois_dims[0], output_size[0], output_size[1]};
  if (ffi::Error error =
          expect_dims("RoI pooling output or cotangent", pooled,
                      {shape.rois, shape.channels, shape.pooled_height, shape.pooled_width});
      error.failure()) {
    return error;
  }
  bool ran = false;
  if (ffi::Error error = ffi_guarded([&] { ran = run(shape); }); error.failure()) return error;
  return ran ? ffi::Error::Success()
             : ffi::Error::InvalidArgument(
                   "RoI pooling: rois[:, 0] must be image indices in [0, N) of the input");
}

RoiAlignParams params_of(const RoiAlignAttributes& attributes) {
  return {attributes.spatial_scale, attributes.sampling_ratio, attributes.aligned};
}

template <ffi::DataType kType>
ffi::Error RoiAlign(ffi::Buffer<kType> input, ffi::Buffer<kType> rois,
                    RoiAlignAttributes attributes, ffi::ResultBuffer<kType> out) {
  return run_roi(input.dimensions(), rois, attributes.output_size, out->dimensions(),
                 [&](const RoiShape& shape) {
                   return roi_align<Native<kType>>(input.typed_data(), rois.typed_data(), shape,
                                                   params_of(attributes), out->typed_data());
                 });
}

// The gradient in the input, [N, C, H, W] as the result's shape says.
template <ffi::DataType kType>
ffi::Error RoiAlignVjp(ffi::Buffer<kType> rois, ffi::Buffer<kType> cotangent,
                       RoiAlignAttributes attributes, ffi::ResultBuffer<kType> d_input) {
  return run_roi(d_input->dimensions(), rois, attributes.output_size, cotangent.dimensions(),
                 [&](const RoiShape& shape) {
                   return roi_align_vjp<Native<kType>>(rois.typed_data(), cotangent.typed_data(),
                                                       shape, params_of(attributes),
                                                       d_input->typed_data());
                 });
}

template <ffi::DataType kType>
ffi::Error RoiPool(ffi::Buffer<kType> input, ffi::Buffer<kType> rois,
                   RoiPoolAttributes attributes, ffi::ResultBuffer<kType> out) {
  return run_roi(input.dimensions(), rois, attributes.output_size, out->dimensions(),
                 [&](const RoiShape& shape) {
                   return roi_pool<Native<kType>>(input.typed_data(), rois.typed_data(), shape,
                                                  attributes.spatial_scale, out->typed_data(),
                                                  nullptr);
                 });
}

// The gradient in the input (its argmaxes found again).
template <ffi::DataType kType>
ffi::Error RoiPoolVjp(ffi::Buffer<kType> input, ffi::Buffer<kType> rois,
                      ffi::Buffer<kType> cotangent, RoiPoolAttributes attributes,
                      ffi::ResultBuffer<kType> d_input) {
  if (d_input->element_count() != input.element_count()) {
    return ffi::Error::InvalidArgument("roi_pool gradient: d_input of the input's shape");
  }
  return run_roi(input.dimensions(), rois, attributes.output_size, cotangent.dimensions(),
                 [&](const RoiShape& shape) {
                   return roi_pool_vjp<Native<kType>>(
                       input.typed_data(), rois.typed_data(), cotangent.typed_data(), shape,
                       attributes.spatial_scale, d_input->typed_data());
                 });
}

}  // namespace

AK_FLOAT_HANDLER(roi_align, RoiAlign)
AK_FLOAT_HANDLER(roi_align_vjp, RoiAlignVjp)
AK_FLOAT_HANDLER(roi_pool, RoiPool)
AK_FLOAT_HANDLER(roi_pool_vjp, RoiPoolVjp)

}  // namespace asickernels_cpu::entry

#endif  // ASICKERNELS_CPU_ENTRY_POINTS
