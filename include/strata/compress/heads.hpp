// Attention-head pruning (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): a
// MultiheadAttention's heads ranked by the weights of out_proj that read them, and the least
// important masked so they contribute nothing, or removed (HuggingFace's prune_heads): their
// projection rows and out_proj columns cut out, so the attention computes with fewer heads.
//
//   auto kept = compress::prune_heads(layer.self_attn, 2);  // mask the 2 least important heads
//   ... opt.step();  // the next self_attn(q, k, v) call re-applies the masks (Note [Keeping pruned weights zero])
//   compress::remove_heads(layer.self_attn, {1, 3});        // or cut heads 1 and 3 out
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
/// Removes `heads` (indices of the current heads; repeats count once) from `attn`: their rows
/// of the query, key and value projections and biases, their features of bias_k / bias_v, and
/// their columns of out_proj.weight are cut out (the handles stay; pruning masks are cut
/// alike), and num_heads drops; embed_dim and head_dim stay. Gradients are dropped: make
/// optimizers after. Raises Error for a head out of range or when no head would be left.
STRATA_API void remove_heads(nn::MultiheadAttention& attn, const std::vector<int64_t>& heads);

}  // namespace strata::compress
