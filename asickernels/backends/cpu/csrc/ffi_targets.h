// Every XLA FFI handler of the library (xla_ffi.cpp, roi_align.cpp), as X(name) for the symbol
// asickernels_cpu_ffi_<name>: what Python registers with XLA (asickernels_cpu_ffi_target_name).
#pragma once

#define AK_FFI_BOX_TARGETS(X, kind)                                                  \
  X(kind##_box_metric_f32) X(kind##_box_metric_f64) X(kind##_box_metric_vjp_f32)     \
      X(kind##_box_metric_vjp_f64)

#define AK_FFI_TARGETS(X)                                                            \
  AK_FFI_BOX_TARGETS(X, paired)                                                      \
  X(paired_box_metric_vjp_first_f32) X(paired_box_metric_vjp_first_f64)              \
      AK_FFI_BOX_TARGETS(X, pairwise) X(nms_f32) X(nms_f64) X(batched_nms_f32)        \
          X(batched_nms_f64) X(int8_matmul) X(int8_matmul_scaled_f32)                \
              X(int8_matmul_scaled_f64) X(roi_align_f32) X(roi_align_f64)            \
                  X(roi_align_vjp_f32) X(roi_align_vjp_f64) X(roi_pool_f32) X(roi_pool_f64) \
                      X(roi_pool_vjp_f32) X(roi_pool_vjp_f64)
