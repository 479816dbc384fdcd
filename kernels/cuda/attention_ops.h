// Entry points of the CUDA fused attention kernels (kernels/cuda/attention.cu; Note [Fused
// attention] in src/nn/attention_fused.cpp), callable from plain C++. Instantiated for Half,
// BFloat16 and float, computed in float. q (batch, L, D), k and v (batch, S, D), o and its
// gradient (batch, L, D), each where its entry of the math::AttentionLayout says (columns
// adjacent), D <= kMaxAttentionDim; lse (batch, L), contiguous, is each query's natural
// logsumexp. L, S and D must be positive (the op takes the composed path
// otherwise; the launcher checks). Each launches on `stream` and returns the launch's
// cudaError_t.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/attention_math.h"
#include "../common/half.h"

namespace strata::cuda_kernels {

inline constexpr int64_t kMaxAttentionDim = 128;
inline constexpr int64_t kAttentionTile = 64;  // queries per block, keys per step
// Query and key blocks ride in gridDim.y, which holds at most 65535.
inline constexpr int64_t kMaxAttentionRows = 65535 * kAttentionTile;

/// The most dynamic shared memory, in bytes, the forward and backward kernels ask for at head
/// dim D: 150.5 KiB from 65 to 128, which Hopper (227 KiB a block) and A100 (163) grant but GPUs
/// of compute capability 8.6 and 8.9 (99) do not. 0 above kMaxAttentionDim.
size_t attention_shared_bytes(int64_t D);

/// Dropout of the weights: factor 0 or scale = 1 / (1 - rate) per element of the flattened
/// (batch, L, S) weights, from Philox (seed, offset) as functional::dropout draws. rate 0: none.
struct AttentionDropout {
  float rate = 0;
  float scale = 1;
  uint64_t seed = 0, offset = 0;
};

/// o = softmax(scale q k^T, causally masked when causal) v, and lse.
template <class T>
cudaError_t attention_forward(cudaStream_t stream, const T* q, const T* k, const T* v, T* o, float* lse,
                              int64_t batch, int64_t L, int64_t S, int64_t D, double scale, bool causal,
                              AttentionDropout dropout, const math::AttentionLayout& layout);

/// gq, gk, gv from the forward's inputs, output o, its gradient go and lse. delta is scratch of
/// batch * L floats (each query's do . o). Deterministic: no atomics.
template <class T>
cudaError_t attention_backward(cudaStream_t stream, const T* q, const T* k, const T* v, const T* o, const T* go,
                               const float* lse, float* delta, T* gq, T* gk, T* gv, int64_t batch, int64_t L,
                               int64_t S, int64_t D, double scale, bool causal, AttentionDropout dropout,
                               const math::AttentionLayout& layout);

}  // namespace strata::cuda_kernels
