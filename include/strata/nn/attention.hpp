// MultiheadAttention with PyTorch's parameter layout: in_proj_weight (3E, E) and in_proj_bias
// (3E) hold the query, key and value projections stacked, out_proj is a Linear(E, E). The
// attention itself is nn::functional::scaled_dot_product_attention.
//
// Masks follow PyTorch's MultiheadAttention: a bool key_padding_mask (N, S) or attn_mask
// (L, S) / (N * num_heads, L, S) is true where attending is NOT allowed; a float mask is added
// to the attention scores.
#pragma once

#include <cstdint>
#include <string>

#include <strata/nn/linear.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct MultiheadAttentionOptions {
  double dropout = 0;        // on the attention weights, in training
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // (N, L, E) rather than (L, N, E)
  Generator* generator = nullptr;  // initial values and dropout masks; default_generator() when null
};

class STRATA_API MultiheadAttention : public Module {
 public:
  /// embed_dim must be divisible by num_heads.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});

  /// Attention of query (L, N, E) over key (S, N, E) and value (S, N, E) ((N, L, E) etc. with
  /// batch_first; unbatched (L, E) too). Returns (L, N, E). is_causal masks keys after each
  /// query, on top of attn_mask when both are given.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(), bool is_causal = false);
  /// Self-attention: forward(x, x, x).
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }
  std::string name() const override { return "MultiheadAttention"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t embed_dim, num_heads, head_dim;
  MultiheadAttentionOptions options;
  Tensor in_proj_weight;  // (3 * embed_dim, embed_dim)
  Tensor in_proj_bias;    // (3 * embed_dim), undefined without bias
  Linear out_proj;
};

}  // namespace strata::nn
