// Entry points of the CUDA reductions, softmax and scans, callable from plain C++ (no CUDA
// headers beyond the runtime API's types). Each is instantiated in kernels/cuda/reduce_*.cu,
// softmax.cu or scan.cu for the dtypes the registry uses and returns the first launch error.
// Reductions take the ReducePlan the CPU kernels walk (any dims, strides, keepdim); outputs
// are written at the plan's output offsets. Accumulation types and NaN rules are those of
// kernels/common/reduce_ops.h: float32 sums in double, float16/bfloat16 in float, integers
// in int64 (wrapping).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "../common/convert.h"
#include "../common/reduce_plan.h"
#include "index_ops.h"  // Scratch: temporary device memory from the launcher

namespace strata::cuda_kernels {

// sum and prod of integers and bool give int64; floats keep their dtype.
template <class T>
using fold_out_t = std::conditional_t<std::is_floating_point_v<T> || is_reduced_float_v<T>, T, int64_t>;

template <class T>
cudaError_t sum(const ReducePlan& plan, cudaStream_t s, fold_out_t<T>* out, const T* in, const Scratch& scratch);
template <class T>  // floating T only
cudaError_t mean(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch);
template <class T>
cudaError_t prod(const ReducePlan& plan, cudaStream_t s, fold_out_t<T>* out, const T* in, const Scratch& scratch);
template <class T>  // NaN wins
cudaError_t amax(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch);
template <class T>
cudaError_t amin(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch);

// Index along the (single, after coalescing) reduced dim of the first extreme value, the first
// NaN when there is one; `values` (nullable) is written at the same offsets as `indices`.
template <class T>
cudaError_t argmax(const ReducePlan& plan, cudaStream_t s, int64_t* indices, T* values, const T* in,
                   const Scratch& scratch);
template <class T>
cudaError_t argmin(const ReducePlan& plan, cudaStream_t s, int64_t* indices, T* values, const T* in,
                   const Scratch& scratch);

// Floating T only. var: two passes (mean, then squared deviations), divided by
// max(0, n - correction), square-rooted when take_sqrt. logsumexp: max, then the sum of
// exp(x - max) (an infinite max shifts by 0). norm: the p-norm, inf and -inf included.
template <class T>
cudaError_t var(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, double correction, bool take_sqrt,
                const Scratch& scratch);
template <class T>
cudaError_t logsumexp(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch);
template <class T>
cudaError_t norm(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, double p, const Scratch& scratch);

// Along the middle dim of contiguous (outer, n, inner) arrays x and y. causal_rows: as in
// cpu::softmax (kernels/cpu/softmax.h), inner == 1 only.
template <class T>  // floating T; log_softmax when `log`
cudaError_t softmax(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner, bool log,
                    int64_t causal_rows = 0);
// dx from softmax's (log_softmax's when `log`) output y and the gradient g in it
// (kernels/common/softmax_math.h); contiguous (outer, n, inner) arrays.
template <class T>
cudaError_t softmax_backward(cudaStream_t s, T* dx, const T* y, const T* g, int64_t outer, int64_t n, int64_t inner,
                             bool log);
template <class T>  // int64_t or floating T, accumulating as the CPU's cpu::scan
cudaError_t cumsum(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner,
                   const Scratch& scratch);
template <class T>
cudaError_t cumprod(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner,
                    const Scratch& scratch);

}  // namespace strata::cuda_kernels
