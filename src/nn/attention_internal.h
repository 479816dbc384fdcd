// The fused attention op (Note [Fused attention] in src/nn/attention_fused.cpp), shared by
// scaled_dot_product_attention and the CUDA kernels' launchers.
#pragma once

#include <optional>
#include <string_view>

#include <strata/core/generator.hpp>
#include <strata/core/registry.hpp>
#include <strata/core/tensor.hpp>

#include "kernels/common/attention_math.h"

namespace strata::nn::detail {

/// The parameter of the attention and attention_backward kernels.
struct AttentionParams {
  double scale = 1;
  bool causal = false;
  double dropout = 0;  // the rate; the draw is (seed, offset), as functional::dropout's
  uint64_t seed = 0, offset = 0;
};

/// The largest head dim the CUDA kernels take (queries, keys and values of one head dim), and
/// the most queries or keys (their 64-row blocks ride in a grid's y dim).
inline constexpr int64_t kCudaAttentionMaxDim = 128;
inline constexpr int64_t kCudaAttentionMaxRows = 65535 * 64;

/// Where t keeps its rows, when the kernels can read or write it in place: columns adjacent,
/// rows at least a row apart, batch dims that fold into two strided dims (math::AttentionRows);
/// else nullopt.
std::optional<math::AttentionRows> attention_rows(const Tensor& t);

/// The rows of every tensor of an attention (3 inputs, 2 outputs) or attention_backward (6
/// inputs, 3 outputs) kernel call; raises an Error naming `op` for a tensor the kernels cannot
/// address, or a logsumexp that is not contiguous.
math::AttentionLayout attention_layout(const KernelCall& call, std::string_view op);

/// Whether a block on CUDA device `device` may opt in to the shared memory the fused kernels
/// take at head dim E (src/ops/cuda/attention.cpp); false in a build without CUDA.
bool cuda_attention_fits(int device, int64_t head_dim);

/// Whether attention of q (..., L, E) over k (..., S, E), v (..., S, Ev) with no mask and
/// dropout at rate `dropout` may run the fused kernels: switched on for the device, kernels for
/// its dtype, a rate below 1, one dtype and device, the same batch dims, no empty dim (and on
/// CUDA, E == Ev <= 128, shared memory for E on the device, at most kCudaAttentionMaxRows
/// queries and keys, fewer than 2^31 problems).
bool fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, double dropout);

/// dropout(softmax(scale q k^T (causally masked))) v through the fused kernels, dropping the
/// weights functional::dropout would with `gen` (the default generator when null) and drawing
/// as much from it; differentiable in q, k and v (twice: the backward of a create_graph pass is
/// composed of ops).
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, double dropout,
                       Generator* gen);

}  // namespace strata::nn::detail
