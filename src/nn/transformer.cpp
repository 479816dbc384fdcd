// TransformerEncoderLayer: x + SA(x) and x + FF(x), normalized after (post-norm) or before
// (pre-norm) each block, as torch.nn.TransformerEncoderLayer computes them.
#include <strata/nn/functional.hpp>
#include <strata/nn/transformer.hpp>
#include <strata/ops/binary.hpp>

namespace strata::nn {

namespace {
const TransformerEncoderLayerOptions& checked(const TransformerEncoderLayerOptions& o) {
  STRATA_CHECK(o.activation == "relu" || o.activation == "gelu",
               "[TransformerEncoderLayer] activation must be \"relu\" or \"gelu\", got \"{}\"", o.activation);
  STRATA_CHECK(o.dim_feedforward > 0, "[TransformerEncoderLayer] dim_feedforward must be positive, got {}",
               o.dim_feedforward);
  return o;
}
}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerEncoderLayerOptions o)
    : options(checked(o)),
      self_attn(d_model, nhead,
                {.dropout = o.dropout, .bias = o.bias, .batch_first = o.batch_first, .generator = o.generator}),
      linear1(d_model, o.dim_feedforward, {.bias = o.bias, .generator = o.generator}),
      dropout(o.dropout, o.generator),
      linear2(o.dim_feedforward, d_model, {.bias = o.bias, .generator = o.generator}),
      norm1(d_model, {.eps = o.layer_norm_eps, .bias = o.bias}),
      norm2(d_model, {.eps = o.layer_norm_eps, .bias = o.bias}),
      dropout1(o.dropout, o.generator),
      dropout2(o.dropout, o.generator) {
  register_module("self_attn", self_attn);
  register_module("linear1", linear1);
  register_module("dropout", dropout);
  register_module("linear2", linear2);
  register_module("norm1", norm1);
  register_module("norm2", norm2);
  register_module("dropout1", dropout1);
  register_module("dropout2", dropout2);
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding,
                                                     bool is_causal) {
  return dropout1(self_attn(x, x, x, padding, mask, is_causal));
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  Tensor h = linear1(x);
  h = options.activation == "gelu" ? functional::gelu(h) : functional::relu(h);
  return dropout2(linear2(dropout(h)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                        bool is_causal) {
  Tensor x = src;
  if (options.norm_first) {
    x = x + self_attention_block(norm1(x), src_mask, src_key_padding_mask, is_causal);
    x = x + feed_forward_block(norm2(x));
  } else {
    x = norm1(x + self_attention_block(x, src_mask, src_key_padding_mask, is_causal));
    x = norm2(x + feed_forward_block(x));
  }
  return x;
}

Tensor TransformerEncoderLayer::operator()(const Tensor& src, const Tensor& src_mask,
                                          const Tensor& src_key_padding_mask, bool is_causal) {
  if (!hooks_active()) return forward(src, src_mask, src_key_padding_mask, is_causal);
  return call_hooked({src, src_mask, src_key_padding_mask},
                     [&](const std::vector<Tensor>& in) { return forward(in[0], in[1], in[2], is_causal); });
}

}  // namespace strata::nn
