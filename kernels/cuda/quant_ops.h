// Entry points of the CUDA quantization kernels (kernels/cuda/quant.cu), callable from plain
// C++: the device side of the CPU loops in kernels/cpu/quant.h and qgemm.h, with the same
// per-element math (kernels/common/quant_affine.h) and contracts. Every pointer is to contiguous
// device memory; each function launches on `s` and returns the first launch error.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/half.h"
#include "../common/im2col.h"
#include "../common/quant_affine.h"
#include "../common/quant_rowwise.h"

namespace strata::cuda_kernels::quant {

using qmath::ChannelLayout;

template <class Q>
cudaError_t quantize_affine(const float* x, Q* q, ChannelLayout l, const float* scale, const int32_t* zero_point,
                            int32_t qmin, int32_t qmax, cudaStream_t s);
template <class Q>
cudaError_t dequantize_affine(const Q* q, float* x, ChannelLayout l, const float* scale, const int32_t* zero_point,
                              cudaStream_t s);
cudaError_t fake_quantize(const float* x, float* out, uint8_t* mask, ChannelLayout l, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax, cudaStream_t s);
cudaError_t quantize_rows_uint8(const float* x, int64_t M, int64_t K, uint8_t* q, float* scale, int32_t* zero_point,
                               cudaStream_t s);
/// c (M, N) = a (M, K) . b (N, K)^T in int32.
cudaError_t gemm_s8s8s32(const int8_t* a, const int8_t* b, int32_t* c, int64_t M, int64_t N, int64_t K,
                         cudaStream_t s);
/// The int8 Linear of kernels/cpu/qgemm.h (int8_linear, uint8 activations), float output; bias
/// may be null.
cudaError_t int8_linear(const uint8_t* xq, const float* x_scale, const int32_t* x_zero, bool x_per_row,
                        const int8_t* wq, const float* w_scale, const int32_t* w_row_sum, const float* bias, float* y,
                        int64_t M, int64_t N, int64_t K, cudaStream_t s);
cudaError_t quantize_int4_groups(const float* w, int64_t N, int64_t K, int64_t group, bool symmetric,
                                 uint8_t* packed, float* scale, uint8_t* zero_point, cudaStream_t s);
cudaError_t dequantize_int4(const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t N,
                            int64_t K, int64_t group, float* w, cudaStream_t s);
/// T is float or BFloat16; zero_point null: symmetric.
template <class T>
cudaError_t int4_linear(const T* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                        int64_t group, const T* bias, T* y, int64_t M, int64_t N, int64_t K, cudaStream_t s);

/// cols (N * OH * OW, kh * kw * Cg) uint8 gathered from the codes x (N, H, W, C) (kernels/common/im2col.h).
cudaError_t im2col_u8(const uint8_t* x, int64_t N, const qmath::Im2colShape& shape, uint8_t pad, uint8_t* cols,
                      cudaStream_t s);

/// The row-wise embedding kernels of kernels/cpu/qembedding.h (quantize_rows_float_qparams,
/// embedding_bag_rowwise); the table's and bags' pointers are device memory.
cudaError_t quantize_rowwise(const float* w, int64_t rows, int64_t dim, int bits, uint8_t* codes, float* scale,
                             float* bias, cudaStream_t s);
cudaError_t embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, float* out, cudaStream_t s);

}  // namespace strata::cuda_kernels::quant
