// Entry points of the CUDA elementwise kernels, callable from plain C++ (no CUDA headers
// beyond the runtime API's types): each is instantiated in a kernels/cuda/*.cu file for the
// (functor, dtype) pairs the registry uses, and returns the launch's cudaError_t.
// T is the storage type; float16/bfloat16 compute in float32 (compute_t<T>).
#pragma once

#include <cuda_runtime_api.h>

#include "../common/strided_loop.h"

namespace strata::cuda_kernels {

template <class F, class T>
cudaError_t unary(const StridedLoop<2>& loop, cudaStream_t s, T* out, const T* in, F f);  // out = f(in)

template <class T>
cudaError_t logical_not(const StridedLoop<2>& loop, cudaStream_t s, bool* out, const T* in);

template <class F, class T, class Out>
cudaError_t binary(const StridedLoop<3>& loop, cudaStream_t s, Out* out, const T* a, const T* b, F f);

template <class T>
cudaError_t where(const StridedLoop<4>& loop, cudaStream_t s, T* out, const bool* cond, const T* a, const T* b);

}  // namespace strata::cuda_kernels
