// The quantization kernels behind one call per operation, routed by device: the CPU loops of
// kernels/cpu/quant.h and qgemm.h, or the CUDA launchers of cuda_quant.h. Callers have checked
// shapes and dtypes; every tensor here is contiguous and on one device. Scales are float32 and
// zero points int32 (int4: uint8), one per channel, row or group.
#pragma once

#include <initializer_list>

#include <strata/core/registry.hpp>
#include <strata/core/tensor.hpp>

#include "kernels/common/im2col.h"
#include "kernels/cpu/conv.h"
#include "kernels/common/quant_affine.h"

namespace strata::quant::detail {

using qmath::ChannelLayout;

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

/// Registers an op of `inputs` inputs with the CPU kernel `cpu` and the CUDA kernel `cuda` for each
/// dtype (the dtype run calls it with: the op's first input's).
OpId add_op(const char* name, int inputs, std::initializer_list<DType> dtypes, KernelFn cpu, KernelFn cuda);
/// Runs `op` through run_kernel (the path every op takes), with the kernel's parameters.
void run(OpId op, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
         const void* params = nullptr);

/// The (outer, channels, inner) view of `shape` for per-channel work along `axis` (-1: per tensor).
ChannelLayout layout_of(const Shape& shape, int64_t axis);

/// x float32 -> q int8/uint8.
void run_quantize(const Tensor& x, const Tensor& q, ChannelLayout l, const Tensor& scale, const Tensor& zero_point,
                  int32_t qmin, int32_t qmax);
/// q int8/uint8 -> out float32.
void run_dequantize(const Tensor& q, const Tensor& out, ChannelLayout l, const Tensor& scale,
                    const Tensor& zero_point);
/// x float32 -> out float32 and mask uint8 (1 where the straight-through gradient passes; undefined:
/// not written).
void run_fake_quantize(const Tensor& x, const Tensor& out, const Tensor& mask, ChannelLayout l, const Tensor& scale,
                       const Tensor& zero_point, int32_t qmin, int32_t qmax);

/// x (M, K) float32 -> q uint8 (M, K), scale (M), zero_point (M): dynamic per-row activations.
void run_quantize_rows_uint8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zero_point);
/// y (M, N) float32 = int8 Linear of uint8 activations (kernels/cpu/qgemm.h, int8_linear); bias
/// may be undefined.
void run_int8_linear(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool x_per_row, const Tensor& wq,
                     const Tensor& w_scale, const Tensor& w_row_sum, const Tensor& bias, const Tensor& y);
/// cols (N * OH * OW, kh * kw * Cg) uint8 from the codes x (N, H, W, C) uint8 (kernels/common/im2col.h).
void run_im2col_u8(const Tensor& x, const qmath::Im2colShape& shape, uint8_t pad, const Tensor& cols);
/// y (N * OH * OW, out) float32 = the int8 Linear's epilogue (x_scale per tensor, w_scale per
/// channel, bias or undefined) of the exact int32 convolution of the codes (N, H, W, C) uint8 with
/// zero point x_zero (1) by wcodes (out, C / groups, kH, kW) int8, by oneDNN (kernels/cpu/conv.h,
/// U8S8). False, having written nothing, on other devices or when oneDNN does not take it.
bool run_conv2d_int8_onednn(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, const Tensor& wcodes,
                            const Tensor& w_scale, const Tensor& bias, const cpu::ConvGeometry& g, const Tensor& y);
/// c (M, N) int32 = a (M, K) int8 . b (N, K)^T int8.
void run_int8_gemm(const Tensor& a, const Tensor& b, const Tensor& c);

/// w (N, K) float32 -> packed (N, K / 2) uint8, scale (N, K / group), zero_point (same, uint8) or
/// undefined when symmetric.
void run_quantize_int4(const Tensor& w, int64_t group, bool symmetric, const Tensor& packed, const Tensor& scale,
                       const Tensor& zero_point);
/// w (N, K) float32 from the packed form.
void run_dequantize_int4(const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                         const Tensor& w);
/// y (M, N) = x (M, K) . dequantize(w)^T + bias; x, bias, y float32 or bfloat16 alike.
void run_int4_linear(const Tensor& x, const Tensor& packed, const Tensor& scale, const Tensor& zero_point,
                     int64_t group, const Tensor& bias, const Tensor& y);

}  // namespace strata::quant::detail
