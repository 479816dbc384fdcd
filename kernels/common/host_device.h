// Marks functions that compile for both the host and CUDA devices. Per-element math that the
// CPU and CUDA kernels share is written once, in this folder, with this macro.
#pragma once

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STRATA_HOST_DEVICE inline
#endif
