// CUDA launchers of the quantization kernels (kernels/cuda/quant.cu): the device side of
// dispatch.h, with the same contracts. Without CUDA, no_cuda_quant.cpp defines them to raise.
#pragma once

#include <strata/core/tensor.hpp>

#include "kernels/common/im2col.h"
#include "kernels/common/quant_affine.h"
#include "kernels/common/quant_rowwise.h"

namespace strata::quant::cuda_quant {

using qmath::ChannelLayout;

void quantize(const Tensor& x, const Tensor& q, ChannelLayout l, const Tensor& scale, const Tensor& zero_point,
              int32_t qmin, int32_t qmax);
void dequantize(const Tensor& q, const Tensor& out, ChannelLayout l, const Tensor& scale, const Tensor& zero_point);
void fake_quantize(const Tensor& x, const Tensor& out, const Tensor& mask, ChannelLayout l, const Tensor& scale,
                   const Tensor& zero_point, int32_t qmin, int32_t qmax);
void quantize_rows_uint8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zero_point);
void int8_linear(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool x_per_row, const Tensor& wq,
                 const Tensor& w_scale, const Tensor& w_row_sum, const Tensor& bias, const Tensor& y);
void int8_gemm(const Tensor& a, const Tensor& b, const Tensor& c);
void quantize_int4(const Tensor& w, int64_t group, bool symmetric, const Tensor& packed, const Tensor& scale,
                   const Tensor& zero_point);
void dequantize_int4(const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                     const Tensor& w);
void int4_linear(const Tensor& x, const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                 const Tensor& bias, const Tensor& y);

void im2col_u8(const Tensor& x, const qmath::Im2colShape& shape, uint8_t pad, const Tensor& cols);

/// Row-wise embeddings: codes, scale and bias of w's rows; the bags of (t, g), whose pointers the
/// caller took from tensors on out's device.
void quantize_rowwise(const Tensor& w, int bits, const Tensor& codes, const Tensor& scale, const Tensor& bias);
void embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, const Tensor& out);

}  // namespace strata::quant::cuda_quant
