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

template <class F, class T>  // out = f(g, saved): the activation gradients (activation_grad_math.h)
cudaError_t activation_grad(const StridedLoop<3>& loop, cudaStream_t s, T* out, const T* g, const T* saved, F f);

template <class T>
cudaError_t where(const StridedLoop<4>& loop, cudaStream_t s, T* out, const bool* cond, const T* a, const T* b);

template <class T>  // |a - b| <= atol + rtol |b| in float64 (kernels/common/compare_math.h)
cudaError_t isclose(const StridedLoop<3>& loop, cudaStream_t s, bool* out, const T* a, const T* b, double rtol,
                    double atol, bool equal_nan);

template <class In, class Out>
cudaError_t copy(const StridedLoop<2>& loop, cudaStream_t s, Out* out, const In* in);  // out = convert<Out>(in)

template <class T>
cudaError_t fill(const StridedLoop<1>& loop, cudaStream_t s, T* out, T value);

// Factories writing a contiguous out[0, n): the same Philox streams and formulas as the CPU
// kernels of src/ops/creation.cpp (value i depends only on seed, offset and i). A non-null
// `state` replaces seed and offset by state[0], state[1], read on the device (a CUDA graph
// refills them before each replay).
template <class T>
cudaError_t uniform(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, double low, double high,
                    const uint64_t* state = nullptr);
template <class T>
cudaError_t normal(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, double mean, double std,
                   const uint64_t* state = nullptr);
template <class T>
cudaError_t randint(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, int64_t low, int64_t high,
                    const uint64_t* state = nullptr);
template <class T>  // start + i * step; with `last_exact`, value n - 1 is `end` (linspace)
cudaError_t arange(int64_t n, cudaStream_t s, T* out, double start, double step, bool last_exact, double end);

}  // namespace strata::cuda_kernels
