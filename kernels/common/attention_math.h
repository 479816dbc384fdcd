// Per-element math of fused attention (Note [Fused attention] in src/nn/attention_fused.cpp),
// shared by the CPU and CUDA kernels. For one (L, S) problem with scores s_ij = scale q_i.k_j:
//   forward   p_ij = exp(s_ij - lse_i),  lse_i = log sum_j exp(s_ij),  o_i = sum_j p_ij v_j
//   backward  dv_j = sum_i p_ij do_i,  dp_ij = do_i.v_j,  ds_ij = p_ij (dp_ij - delta_i),
//             delta_i = do_i.o_i,  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i
// where j runs over the keys query i may attend. With dropout, o and dv use p m and dp is
// m (do.v_j), where m is 0 or 1 / (1 - rate) per weight; delta = do.o still holds.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "philox.h"

namespace strata::math {

// Where one tensor of a fused attention call keeps its rows: element (problem, row, col) of its
// (problems, rows, cols) view, the problems being its batch dims flattened, is at
// offset(problem) + row * row_stride + col. The batch dims fold into at most two strided dims,
// `inner` problems per step of the outer one (a GPT's (batch, heads) split of one qkv
// projection: heads inner, rows 3 * width apart), so the kernels read such views in place.
struct AttentionRows {
  int64_t inner = 1;
  int64_t outer_stride = 0, inner_stride = 0, row_stride = 0;

  STRATA_HOST_DEVICE int64_t offset(int64_t problem) const {
    return problem / inner * outer_stride + problem % inner * inner_stride;
  }
};

// The rows of a contiguous (problems, rows, cols) tensor.
STRATA_HOST_DEVICE AttentionRows contiguous_attention_rows(int64_t rows, int64_t cols) {
  return AttentionRows{1, rows * cols, 0, cols};
}

// The rows of every tensor of a call: the forward reads q, k, v and writes o; the backward also
// reads go (the gradient of o) and writes gq, gk and gv.
struct AttentionLayout {
  AttentionRows q, k, v, o, go, gq, gk, gv;
};

// How many keys query `row` attends: all S, or with a causal mask j <= row (top-left
// aligned, as scaled_dot_product_attention's is_causal and PyTorch's).
STRATA_HOST_DEVICE int64_t attention_keys(int64_t row, int64_t keys, bool causal) {
  if (!causal) return keys;
  return row + 1 < keys ? row + 1 : keys;
}

// The dropout factor of element e of the flattened (batch, L, S) weights: the draw of
// functional::dropout over the weights (Note [Random stream layout]), so the fused path drops
// what the composed one does. r holds the Philox block of e / 4.
template <class C>
STRATA_HOST_DEVICE C attention_dropout_factor(const philox::Block& r, uint64_t e, float rate, C scale) {
  return philox::dropout_factor(philox::lane(r, static_cast<unsigned>(e % 4)), rate, scale);
}

template <class C>
STRATA_HOST_DEVICE C attention_dropout_factor(uint64_t e, float rate, C scale, uint64_t seed, uint64_t offset) {
  return attention_dropout_factor(philox::philox4x32_10(offset + e / 4, seed), e, rate, scale);
}

// A weight's gradient through the softmax: ds = p (dp - delta).
template <class C>
STRATA_HOST_DEVICE C attention_score_grad(C p, C dp, C delta) {
  return p * (dp - delta);
}

}  // namespace strata::math
