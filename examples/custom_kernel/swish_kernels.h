// The scaled swish kernels at pointer level, y[i] = x[i] * sigmoid(beta * x[i]), over n
// contiguous elements. They know nothing of strata: swish.cpp turns tensors into pointers
// and registers these as the op's kernels.
#pragma once

#include <cstdint>

namespace swish {

// swish_cpu.cpp
void forward_cpu(const float* x, float* y, int64_t n, float beta);
void forward_cpu(const double* x, double* y, int64_t n, double beta);

// swish_cuda.cu, or swish_no_cuda.cpp in a build without a CUDA compiler.
// True when the CUDA kernels were compiled into this program.
bool cuda_compiled();
// Launch on GPU `device`, on `stream` (a cudaStream_t; null is the legacy default stream).
// x and y are device pointers. Returns null on success, else the CUDA error's text.
const char* forward_cuda(const float* x, float* y, int64_t n, float beta, int device, void* stream);
const char* forward_cuda(const double* x, double* y, int64_t n, double beta, int device, void* stream);

}  // namespace swish
