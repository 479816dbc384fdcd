// Entry points of the CUDA multi-tensor optimizer kernels (kernels/cuda/optim*.cu), callable
// from plain C++: each updates a list of tensors, all on the current device and of one dtype,
// in as few launches as the kernel-argument tables allow (kernels/cuda/multi_tensor.cuh), on
// `stream`, and returns the first launch error. T is float or double; every pointer is to
// contiguous device memory, and tensors of length 0 are skipped.
//
// The per-element rules are those of the CPU loops (kernels/common/optim_math.h). The math
// runs in T, as PyTorch's and apex's fused kernels do, where the CPU loops compute in double:
// on most GPUs double arithmetic runs at 1/32 or 1/64 of the float rate, which would make
// these memory-bound kernels compute-bound. Group constants arrive in double, computed as the
// CPU computes them, and are rounded to T once; norms are summed in double.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/optim_math.h"

namespace strata::cuda_kernels::optim {

// ---- SGD: buf null for every tensor when momentum is 0 -----------------------------------
template <class T>
struct SgdTensor {
  T* p;
  const T* g;
  T* buf;
  int64_t n;
  bool first;  // the buffer has no history yet: it starts as the gradient
};
template <class T>
cudaError_t sgd(const SgdTensor<T>* ts, int64_t count, const math::SgdConsts<double>& c, cudaStream_t s);

// ---- Adam / AdamW: vmax null for every tensor unless AMSGrad. c.step_size and c.bc2_sqrt
// are replaced by each tensor's own (its step count may differ from the others') ------------
template <class T>
struct AdamTensor {
  T* p;
  const T* g;
  T* m;
  T* v;
  T* vmax;
  int64_t n;
  double step_size, bc2_sqrt;
  const double* corrections;  // when set, {step_size, bc2_sqrt, decay} read on the device (a CUDA graph's)
};
template <class T>
cudaError_t adam(const AdamTensor<T>* ts, int64_t count, const math::AdamConsts<double>& c, cudaStream_t s);

// ---- Adagrad ---------------------------------------------------------------------------
template <class T>
struct AdagradTensor {
  T* p;
  const T* g;
  T* sum;
  int64_t n;
  double clr;  // lr / (1 + (t - 1) * lr_decay), t this tensor's step
};
template <class T>
cudaError_t adagrad(const AdagradTensor<T>* ts, int64_t count, const math::AdagradConsts<double>& c,
                    cudaStream_t s);

// ---- RMSprop: gavg null for every tensor unless centered, buf null unless momentum > 0 ----
template <class T>
struct RmspropTensor {
  T* p;
  const T* g;
  T* sq;
  T* gavg;
  T* buf;
  int64_t n;
};
template <class T>
cudaError_t rmsprop(const RmspropTensor<T>* ts, int64_t count, const math::RmspropConsts<double>& c,
                    cudaStream_t s);

// ---- LAMB: two phases. Phase 1 updates m and v and sums ||p||^2 and ||u||^2 per chunk of
// kLambChunk elements into `partials` (2 doubles per chunk, lamb_num_chunks of them); a
// small kernel adds each tensor's partials in a fixed order and writes its trust ratio to
// ratios[i]; phase 2 applies p -= lr * ratio * u. Deterministic: no atomics. ---------------
inline constexpr int64_t kLambChunk = 16384;
inline int64_t lamb_num_chunks(int64_t n) { return (n + kLambChunk - 1) / kLambChunk; }

template <class T>
struct LambTensor {
  T* p;
  const T* g;
  T* m;
  T* v;
  int64_t n;
  double bc1, bc2;  // this tensor's bias corrections (1 without bias correction)
};
template <class T>
cudaError_t lamb(const LambTensor<T>* ts, int64_t count, const math::LambConsts<double>& c, double lr,
                 double clamp_min, double clamp_max, double* partials, double* ratios, cudaStream_t s);

// ---- 8-bit Adam: both moments in blockwise 8-bit codes (kernels/common/quant8.h), one CUDA
// block per quantization block of `block` <= quant8::kMaxBlock elements; `maps` is device
// memory holding the signed dynamic map then the unsigned one (2 x 256 floats). The math is
// the CPU's (kernels/cpu/optim.h, adam8bit_step) in T, so codes and scales match it bit for
// bit where the compilers' rounding (contractions into fused multiply-adds) agrees ------------
template <class T>
struct Adam8bitTensor {
  T* p;
  const T* g;
  uint8_t* m_codes;
  float* m_absmax;
  uint8_t* v_codes;
  float* v_absmax;
  int64_t n;
  double step_size, bc2_sqrt;
};
template <class T>
cudaError_t adam8bit(const Adam8bitTensor<T>* ts, int64_t count, int64_t block, const float* maps,
                     const math::AdamConsts<double>& c, cudaStream_t s);

}  // namespace strata::cuda_kernels::optim
