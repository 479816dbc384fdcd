// Attention-head pruning by masks (Michel et al. 2019, "Are Sixteen Heads Really Better than
// One?"): a MultiheadAttention's heads ranked by the weights of out_proj that read them, and the
// least important masked so they contribute nothing. MultiheadAttention ties its inner width to
// embed_dim, so heads are masked, not removed physically.
//
//   auto kept = compress::prune_heads(layer.self_attn, 2);  // the 2 least important heads
//   ... opt.step(); compress::reapply_masks(model);  // the transformer layers call
//   // self_attn.forward(q, k, v), which runs no hooks (Note [Keeping pruned weights zero])
#pragma once

#include <cstdint>
#include <vector>

#include <strata/compress/prune.hpp>
#include <strata/nn/attention.hpp>

namespace strata::compress {

/// One score per head (num_heads, float64 on the CPU): the L1 or L2 norm of out_proj.weight's
/// columns that read the head, or for Taylor sum |w * dL/dw| over them (after a backward).
STRATA_API Tensor head_importance(nn::MultiheadAttention& attn, Importance kind = Importance::L1);
/// Masks the heads not in `keep`: their rows of the query, key and value projections (and
/// biases) and their columns of out_proj.weight, through custom_from_mask.
STRATA_API void mask_heads(nn::MultiheadAttention& attn, const std::vector<int64_t>& keep);
/// Masks the `amount` heads of least importance (at least one head stays); returns the heads kept.
STRATA_API std::vector<int64_t> prune_heads(nn::MultiheadAttention& attn, Amount amount,
                                            Importance kind = Importance::L1);

}  // namespace strata::compress
