// Entry points of the CUDA pooling and batch-norm kernels (kernels/cuda/pool.cu,
// kernels/cuda/batch_norm.cu), callable from plain C++. They follow the CPU kernels'
// contracts (kernels/cpu/pool.h, kernels/cpu/batch_norm.h) exactly: the same windows, max
// indices, divisors, NaN rule, shifted double-precision channel sums and coefficients.
// T is the storage type (float, double, Half, BFloat16); arithmetic is in compute_t<T>.
// Each returns the launch's cudaError_t. Results do not depend on the launch configuration
// beyond fp rounding, and no kernel uses atomics, so every result is deterministic.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/half.h"

namespace strata::cuda_kernels {

// ---- pooling -----------------------------------------------------------------------------

/// Input (n, c, ih, iw), output (n, c, oh, ow) and the window.
struct Pool2dShape {
  int64_t n = 0, c = 0, ih = 0, iw = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

/// Element strides of a 4-d array in (n, c, h, w) order; any values (views included).
struct Strides4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

/// y and indices share the strides ys; indices hold h * iw + w of each window's maximum
/// (a NaN counts as the maximum; ties keep the first position).
template <class T>
cudaError_t max_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                               int64_t* indices, const Strides4& ys);
/// gx[p] = sum of gy over the windows that contain p and whose index is p (a gather, so
/// every gx element is written once, with no atomics). Indices that lie outside their own
/// window contribute nothing.
template <class T>
cudaError_t max_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const int64_t* indices,
                                const Strides4& ys, T* gx, const Strides4& xs);

/// divisor_override 0: the window's size (with or without padding, per count_include_pad).
template <class T>
cudaError_t avg_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                               const Strides4& ys, bool count_include_pad, int64_t divisor_override);
template <class T>
cudaError_t avg_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const Strides4& ys, T* gx,
                                const Strides4& xs, bool count_include_pad, int64_t divisor_override);

/// Windows [floor(o * in / out), ceil((o + 1) * in / out)); the window fields of g are unused.
template <class T>
cudaError_t adaptive_avg_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                                        const Strides4& ys);
template <class T>
cudaError_t adaptive_avg_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const Strides4& ys,
                                         T* gx, const Strides4& xs);

// ---- batch normalization -------------------------------------------------------------------

/// Dense (N, C, S) data: element (n, c, s) at n * C * S + c * S + s, or, channels_inner
/// (channels-last), at (n * S + s) * C + c.
struct ChannelLayout {
  int64_t n = 0, c = 0, s = 0;
  bool channels_inner = false;
};

/// Doubles of device scratch the batch-norm and channel-sum kernels need for `l`.
int64_t batch_norm_scratch_doubles(const ChannelLayout& l);

/// Training: mean and biased var of the batch per channel (from shifted sums in double);
/// eval: running_mean / running_var copied to mean / var. Then y = (x - mean) / sqrt(var +
/// eps) * weight + bias, plus residual (null: none, else x's layout), then ReLU when relu.
/// weight, bias may be null; running_* are read only in eval mode.
/// Per-channel arrays hold compute_t<T> values (float, or double for double data).
template <class T>
cudaError_t batch_norm_forward(const ChannelLayout& l, cudaStream_t s, const T* x, T* y, const compute_t<T>* weight,
                               const compute_t<T>* bias, const compute_t<T>* running_mean,
                               const compute_t<T>* running_var, compute_t<T>* mean, compute_t<T>* var, double eps,
                               bool training, const T* residual, bool relu, double* scratch);

/// gx from gy, x and the saved mean / var (the batch's in training, the running ones in
/// eval); gweight = sum gy * (x - mean) / sqrt(var + eps), gbias = sum gy, when not null. With
/// relu_out (the output of a forward with relu, x's layout), gy is the gradient of that output
/// and is read as ReluBackward(gy, relu_out).
template <class T>
cudaError_t batch_norm_backward(const ChannelLayout& l, cudaStream_t s, const T* gy, const T* x, T* gx,
                                const compute_t<T>* weight, const compute_t<T>* mean, const compute_t<T>* var,
                                compute_t<T>* gweight, compute_t<T>* gbias, double eps, bool training,
                                const T* relu_out, double* scratch);

/// out[c] = sum of u over n and s, accumulated in double (a convolution's bias gradient).
template <class T>
cudaError_t channel_sum(const ChannelLayout& l, cudaStream_t s, const T* u, T* out, double* scratch);

}  // namespace strata::cuda_kernels
