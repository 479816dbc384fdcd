// Entry points of the CUDA 3-d pooling kernels (kernels/cuda/pool3d.cu), callable from plain C++.
// They follow the CPU kernels' contracts (kernels/cpu/pool3d.h) exactly, with the same window
// math (kernels/common/pool_window.h): contiguous (planes, D, H, W) volumes, T the storage type
// (float, double, Half, BFloat16), arithmetic in compute_t<T>. No atomics: every result is
// deterministic. Each returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/half.h"
#include "../common/pool_window.h"

namespace strata::cuda_kernels {

/// Max or adaptive max pooling (g.adaptive): y and the flat indices (d * H + h) * W + w.
template <class T>
cudaError_t max_pool3d_forward(const pool_math::Pool3dShape& g, cudaStream_t s, const T* x, T* y, int64_t* indices);
/// gx[p] = the sum of gy over the windows that may hold p and whose index is p (a gather).
template <class T>
cudaError_t max_pool3d_backward(const pool_math::Pool3dShape& g, cudaStream_t s, const T* gy, const int64_t* indices,
                                T* gx);
/// Average or adaptive average pooling (g.adaptive), with g's padding rule and divisor.
template <class T>
cudaError_t avg_pool3d_forward(const pool_math::Pool3dShape& g, cudaStream_t s, const T* x, T* y);
template <class T>
cudaError_t avg_pool3d_backward(const pool_math::Pool3dShape& g, cudaStream_t s, const T* gy, T* gx);

}  // namespace strata::cuda_kernels
