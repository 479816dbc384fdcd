// Marks functions that compile for both the host and CUDA devices. Per-element math that the
// CPU and CUDA kernels share is written once, in this folder, with this macro.
#pragma once

// Forced inline on the host as on the device: a per-element function left out of line (gcc
// declines to inline vec_exp into some kernel loops) is a scalar call per element and stops
// the loop from vectorising.
#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STRATA_HOST_DEVICE inline __attribute__((always_inline))
#endif
