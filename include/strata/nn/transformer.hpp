// TransformerEncoderLayer as in PyTorch: self-attention and a feed-forward block, each with a
// residual connection and LayerNorm, applied after the residual (post-norm, the default) or
// before each block (pre-norm, norm_first). Children and parameter names match PyTorch's
// (self_attn, linear1, linear2, norm1, norm2), so state dicts carry over.
#pragma once

#include <cstdint>
#include <string>

#include <strata/nn/attention.hpp>
#include <strata/nn/dropout.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/module.hpp>
#include <strata/nn/normalization.hpp>

namespace strata::nn {

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;
  Generator* generator = nullptr;  // initial values and dropout masks; default_generator() when null
};

class STRATA_API TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerEncoderLayerOptions options = {});
  /// src (S, N, E) ((N, S, E) with batch_first). Masks as in MultiheadAttention: src_mask
  /// (S, S) or (N * self_attn.num_heads, S, S), src_key_padding_mask (N, S); is_causal adds a causal mask.
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  /// forward(src, src_mask, ...) with the hooks around it: their inputs are {src, src_mask,
  /// src_key_padding_mask} (undefined where not given).
  Tensor operator()(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                    bool is_causal = false);
  using Module::operator();
  std::string name() const override { return "TransformerEncoderLayer"; }

  TransformerEncoderLayerOptions options;
  MultiheadAttention self_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding, bool is_causal);
  Tensor feed_forward_block(const Tensor& x);
};

}  // namespace strata::nn
