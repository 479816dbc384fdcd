// MultiheadAttention with PyTorch's parameter layout: in_proj_weight (3E, E) and in_proj_bias
// (3E) hold the query, key and value projections stacked, out_proj is a Linear(E, E); with key
// or value features other than E (kdim, vdim) the three weights are separate, q_proj_weight,
// k_proj_weight and v_proj_weight. The attention itself is
// nn::functional::scaled_dot_product_attention.
//
// Masks follow PyTorch's MultiheadAttention: a bool key_padding_mask (N, S) or attn_mask
// (L, S) / (N * num_heads, L, S) is true where attending is NOT allowed; a float mask is added
// to the attention scores. The keys add_bias_kv and add_zero_attn append are open to every
// query (the masks are padded for them, as PyTorch pads them), is_causal included.
//
// The projections map to an inner width of num_heads * head_dim features, embed_dim as built.
// compress::remove_heads (HuggingFace's prune_heads) cuts heads out: num_heads drops, head_dim
// and embed_dim stay, and the shapes below read I = num_heads * head_dim for their embed_dim rows
// (in_proj_weight (3I, E), out_proj a Linear(I, E), bias_k (1, 1, I)); a 3-d attn_mask then
// has N * num_heads (the heads left) maps.
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
  int64_t kdim = 0;  // key features; 0: embed_dim
  int64_t vdim = 0;  // value features; 0: embed_dim
  bool add_bias_kv = false;    // learned bias_k and bias_v appended to the projected keys and values
  bool add_zero_attn = false;  // a zero key and value appended to each head's (after bias_kv)
};

/// MultiheadAttention::forward_with_weights's result.
struct AttentionOutput {
  Tensor output;
  Tensor weights;
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
  /// forward(query, key, value, ...) with the hooks around it, as the transformer layers call it;
  /// the hooks' inputs are {query, key, value, key_padding_mask, attn_mask} (the masks undefined
  /// where not given; is_causal is not among them), the output the attention's.
  Tensor operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                    const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                    bool is_causal = false);
  using Module::operator();
  /// forward_with_weights with the hooks around it (torch's attn(q, k, v, need_weights=True)):
  /// inputs as operator()'s, outputs {output, weights}.
  AttentionOutput call_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                                    bool is_causal = false, bool average_attn_weights = true);
  /// forward, and the attention weights, as PyTorch's need_weights=True: the softmax of the
  /// masked scores (after dropout, in training), averaged over the heads to (N, L, S), or per
  /// head (N, num_heads, L, S) when !average_attn_weights; (L, S) or (num_heads, L, S) for
  /// unbatched input. Runs the composed attention, as the weights must be formed.
  AttentionOutput forward_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                                       bool is_causal = false, bool average_attn_weights = true);
  std::string name() const override { return "MultiheadAttention"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t embed_dim, num_heads, head_dim;
  int64_t kdim, vdim;  // key and value features
  MultiheadAttentionOptions options;
  Tensor in_proj_weight;  // (3 * embed_dim, embed_dim); undefined when kdim or vdim differ from embed_dim
  Tensor q_proj_weight;   // (embed_dim, embed_dim), (embed_dim, kdim) and (embed_dim, vdim) when kdim or vdim
  Tensor k_proj_weight;   // differ from embed_dim; else undefined
  Tensor v_proj_weight;
  Tensor in_proj_bias;  // (3 * embed_dim), undefined without bias
  Tensor bias_k;        // (1, 1, embed_dim) with add_bias_kv; else undefined
  Tensor bias_v;
  Linear out_proj;

 private:
  Tensor run(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask,
             const Tensor& attn_mask, bool is_causal, Tensor* weights);
};

}  // namespace strata::nn
