// scaled_dot_product_attention, fused (src/nn/attention_fused.cpp) where it can be, else
// composed of matmul and softmax (the causal mask fused into the softmax), and
// MultiheadAttention on top of it. The heads are strided views of the projections: the fused
// kernels read them in place, the composed path makes them contiguous once for its batched
// products.
#include <algorithm>
#include <cmath>
#include <limits>

#include <strata/amp/autocast.hpp>
#include <strata/nn/attention.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/init.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "nn/attention_internal.h"
#include "ops/softmax_internal.h"

namespace strata::nn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The attention of q (..., L, E) over k (..., S, E), v (..., S, Ev). mask: undefined, bool
// (blocking: true = masked out; else true = may attend) or float (added to the scores). With
// `weights`, the composed path runs and leaves its (..., L, S) weights there.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool blocking,
                 bool is_causal, double dropout_p, std::optional<double> scale, Generator* gen, std::string_view op,
                 Tensor* weights_out = nullptr) {
  amp::detail::AutocastScope amp_scope("scaled_dot_product_attention", q, k, v, mask);
  if (amp_scope.cast())
    return attention(amp_scope[0], amp_scope[1], amp_scope[2], amp_scope[3], blocking, is_causal, dropout_p, scale,
                     gen, op, weights_out);
  STRATA_CHECK(q.defined() && k.defined() && v.defined(), "[{}] query, key or value is undefined", op);
  STRATA_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
               "[{}] query, key and value need shape (..., L, E), got {}, {} and {}", op, q.shape(), k.shape(),
               v.shape());
  STRATA_CHECK(is_floating(q.dtype()) && is_floating(k.dtype()) && is_floating(v.dtype()),
               "[{}] query, key and value must be floating, got {}, {} and {}", op, q.dtype(), k.dtype(), v.dtype());
  // as PyTorch: a float32 key beside float16 queries is most often a missed cast, and the
  // promoted result would silently run at the wider type
  STRATA_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(),
               "[{}] query, key and value must have one dtype, got {}, {} and {}", op, q.dtype(), k.dtype(), v.dtype());
  STRATA_CHECK(k.device() == q.device() && v.device() == q.device(),
               "[{}] query, key and value must be on one device, got {}, {} and {}", op, q.device(), k.device(),
               v.device());
  STRATA_CHECK(q.size(-1) == k.size(-1), "[{}] query {} and key {} differ in their last (embedding) dim", op,
               q.shape(), k.shape());
  STRATA_CHECK(k.size(-2) == v.size(-2), "[{}] key {} and value {} differ in their sequence dim (-2)", op, k.shape(),
               v.shape());
  STRATA_CHECK(dropout_p >= 0 && dropout_p <= 1, "[{}] dropout_p must be in [0, 1], got {}", op, dropout_p);
  for (int64_t i = 3; i <= std::max({q.dim(), k.dim(), v.dim()}); ++i) {  // batch dims broadcast, as products need
    int64_t n = 1;
    bool ok = true;
    for (const Tensor* t : {&q, &k, &v}) {
      const int64_t s = i <= t->dim() ? t->size(-i) : 1;
      ok = ok && (s == 1 || n == 1 || s == n);
      n = s == 1 ? n : s;
    }
    STRATA_CHECK(ok, "[{}] the batch dims of query {}, key {} and value {} do not broadcast", op, q.shape(),
                 k.shape(), v.shape());
  }
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E));
  if (!weights_out && !mask.defined() && detail::fused_attention_applies(q, k, v, dropout_p))
    return detail::fused_attention(q, k, v, sc, is_causal, dropout_p, gen);  // Note [Fused attention]
  // scaling q costs L * E multiplies rather than L * S on the scores. The operands are made
  // contiguous once, here: heads are strided views of a projection, which each product (two
  // forward, four backward) would otherwise compact again for a batched GEMM.
  const Tensor qs = (sc == 1.0 ? q : q * sc).contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor scores = matmul(qs, kc.transpose(-2, -1));  // (..., L, S)
  if (mask.defined()) {
    STRATA_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()),
                 "[{}] attn_mask must be bool or floating (added to the scores), got {}", op, mask.dtype());
    STRATA_CHECK(mask.device() == q.device(), "[{}] attn_mask is on {} but the query is on {}", op, mask.device(),
                 q.device());
    // the mask must broadcast to the scores without growing them
    bool fits = mask.dim() <= scores.dim();
    for (int64_t i = 1; fits && i <= mask.dim(); ++i)
      fits = mask.size(-i) == 1 || mask.size(-i) == scores.size(-i);
    STRATA_CHECK(fits,
                 "[{}] attn_mask of shape {} does not broadcast to the attention scores' shape {} (..., L={}, S={})",
                 op, mask.shape(), scores.shape(), L, S);
    if (mask.dtype() == kBool) scores = blocking ? masked_fill(scores, mask, -kInf) : where(mask, scores, -kInf);
    else scores = scores + mask.to(scores.dtype());
  }
  // a causal mask rides in the softmax kernel: no mask tensor, no masked copy of the scores
  Tensor weights = is_causal ? strata::detail::causal_softmax(scores) : softmax(scores, -1);
  if (dropout_p > 0) weights = functional::dropout(weights, dropout_p, true, gen);
  if (weights_out) *weights_out = weights;
  return matmul(weights, vc);
}

}  // namespace

Tensor functional::scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& attn_mask, double dropout_p, bool is_causal,
                                                std::optional<double> scale, Generator* gen) {
  STRATA_CHECK(!(is_causal && attn_mask.defined()),
               "[scaled_dot_product_attention] pass either attn_mask or is_causal, not both");
  return attention(q, k, v, attn_mask, false, is_causal, dropout_p, scale, gen, "scaled_dot_product_attention");
}

// ---- MultiheadAttention ------------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, MultiheadAttentionOptions opts)
    : embed_dim(e), num_heads(h), head_dim(h > 0 ? e / h : 0), kdim(opts.kdim > 0 ? opts.kdim : e),
      vdim(opts.vdim > 0 ? opts.vdim : e), options(opts),
      out_proj(e > 0 ? e : 0, e > 0 ? e : 0, {.bias = opts.bias, .generator = opts.generator}) {
  STRATA_CHECK(e > 0 && h > 0, "[MultiheadAttention] embed_dim ({}) and num_heads ({}) must be positive", e, h);
  STRATA_CHECK(e % h == 0, "[MultiheadAttention] embed_dim ({}) must be divisible by num_heads ({})", e, h);
  STRATA_CHECK(opts.dropout >= 0 && opts.dropout <= 1, "[MultiheadAttention] dropout must be in [0, 1], got {}",
               opts.dropout);
  STRATA_CHECK(opts.kdim >= 0 && opts.vdim >= 0, "[MultiheadAttention] kdim ({}) and vdim ({}) must not be negative",
               opts.kdim, opts.vdim);
  if (kdim == e && vdim == e) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * e, e}));
  } else {  // PyTorch's layout and order when the key or value features differ
    q_proj_weight = register_parameter("q_proj_weight", empty({e, e}));
    k_proj_weight = register_parameter("k_proj_weight", empty({e, kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({e, vdim}));
  }
  if (opts.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * e}));
  if (opts.add_bias_kv) {
    bias_k = register_parameter("bias_k", empty({1, 1, e}));
    bias_v = register_parameter("bias_v", empty({1, 1, e}));
  }
  register_module("out_proj", out_proj);
  reset_parameters(opts.generator);
}

void MultiheadAttention::reset_parameters(Generator* gen) {
  if (in_proj_weight.defined()) {
    init::xavier_uniform_(in_proj_weight, 1.0, gen);
  } else {
    for (Tensor* w : {&q_proj_weight, &k_proj_weight, &v_proj_weight}) init::xavier_uniform_(*w, 1.0, gen);
  }
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj.bias.defined()) init::zeros_(out_proj.bias);
  if (bias_k.defined()) {
    init::xavier_normal_(bias_k, 1.0, gen);
    init::xavier_normal_(bias_v, 1.0, gen);
  }
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal) {
  return run(query, key, value, key_padding_mask, attn_mask, is_causal, nullptr);
}

Tensor MultiheadAttention::operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal) {
  if (!hooks_active()) return forward(query, key, value, key_padding_mask, attn_mask, is_causal);
  return call_hooked({query, key, value, key_padding_mask, attn_mask}, [&](const std::vector<Tensor>& in) {
    return forward(in[0], in[1], in[2], in[3], in[4], is_causal);
  });
}

AttentionOutput MultiheadAttention::call_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                                      const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                      bool is_causal, bool average_attn_weights) {
  auto run_with = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& padding, const Tensor& mask) {
    return forward_with_weights(q, k, v, padding, mask, is_causal, average_attn_weights);
  };
  if (!hooks_active()) return run_with(query, key, value, key_padding_mask, attn_mask);
  std::vector<Tensor> out =
      call_hooked({query, key, value, key_padding_mask, attn_mask}, [&](const std::vector<Tensor>& in) {
        AttentionOutput r = run_with(in[0], in[1], in[2], in[3], in[4]);
        return std::vector<Tensor>{r.output, r.weights};
      });
  return {out[0], out[1]};
}

AttentionOutput MultiheadAttention::forward_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                                         const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                         bool is_causal, bool average_attn_weights) {
  Tensor weights;  // (N, H, L, S)
  Tensor out = run(query, key, value, key_padding_mask, attn_mask, is_causal, &weights);
  if (average_attn_weights) weights = mean(weights, {1});
  if (query.dim() == 2) weights = weights.squeeze(0);
  return {out, weights};
}

Tensor MultiheadAttention::run(const Tensor& query, const Tensor& key, const Tensor& value,
                               const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal,
                               Tensor* weights) {
  const std::string me = fmt::format("MultiheadAttention(embed_dim={}, num_heads={})", embed_dim, num_heads);
  STRATA_CHECK(query.defined() && key.defined() && value.defined(), "[{}] query, key or value is undefined", me);
  const bool batched = query.dim() == 3;
  STRATA_CHECK((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
               "[{}] expects query, key and value all of shape {} (or unbatched (L, E)), got {}, {} and {}", me,
               options.batch_first ? "(N, L, E)" : "(L, N, E)", query.shape(), key.shape(), value.shape());
  STRATA_CHECK(query.size(-1) == embed_dim, "[{}] query of shape {} does not end in embed_dim {}", me, query.shape(),
               embed_dim);
  STRATA_CHECK(key.size(-1) == kdim, "[{}] key of shape {} does not end in {} {}", me, key.shape(),
               kdim == embed_dim ? "embed_dim" : "kdim", kdim);
  STRATA_CHECK(value.size(-1) == vdim, "[{}] value of shape {} does not end in {} {}", me, value.shape(),
               vdim == embed_dim ? "embed_dim" : "vdim", vdim);
  // internally (A, B, E) with the batch at bd and the sequence at sd
  const int64_t bd = batched ? (options.batch_first ? 0 : 1) : 1, sd = batched ? 1 - bd : 0;
  auto as3 = [&](const Tensor& t) { return batched ? t : t.unsqueeze(1); };
  const Tensor q3 = as3(query), k3 = as3(key), v3 = as3(value);
  const int64_t N = q3.size(bd), L = q3.size(sd), S = k3.size(sd);
  STRATA_CHECK(k3.size(bd) == N && v3.size(bd) == N && v3.size(sd) == S,
               "[{}] query {}, key {} and value {} disagree in batch size or key/value length", me, query.shape(),
               key.shape(), value.shape());

  // projections: one GEMM for self-attention, two when key is value. Each projects to the inner
  // width I = num_heads * head_dim: embed_dim, unless heads were removed (compress::remove_heads)
  const int64_t I = num_heads * head_dim;
  STRATA_CHECK(out_proj.in_features == I,
               "[{}] out_proj (out_proj.weight's columns) reads {} features, not num_heads * head_dim = {}", me,
               out_proj.in_features, I);
  auto w = [&](int64_t i, int64_t n) { return in_proj_weight.narrow(0, i * I, n * I); };
  auto b = [&](int64_t i, int64_t n) {
    return in_proj_bias.defined() ? in_proj_bias.narrow(0, i * I, n * I) : Tensor();
  };
  Tensor qp, kp, vp;
  if (!in_proj_weight.defined()) {
    qp = functional::linear(q3, q_proj_weight, b(0, 1));
    kp = functional::linear(k3, k_proj_weight, b(1, 1));
    vp = functional::linear(v3, v_proj_weight, b(2, 1));
  } else if (query.is_same(key) && key.is_same(value)) {
    auto parts = chunk(functional::linear(q3, in_proj_weight, in_proj_bias), 3, -1);
    qp = parts[0], kp = parts[1], vp = parts[2];
  } else if (key.is_same(value)) {
    qp = functional::linear(q3, w(0, 1), b(0, 1));
    auto parts = chunk(functional::linear(k3, w(1, 2), b(1, 2)), 2, -1);
    kp = parts[0], vp = parts[1];
  } else {
    qp = functional::linear(q3, w(0, 1), b(0, 1));
    kp = functional::linear(k3, w(1, 1), b(1, 1));
    vp = functional::linear(v3, w(2, 1), b(2, 1));
  }
  if (bias_k.defined()) {  // one more key and value, the same for every item
    auto append = [&](const Tensor& t, const Tensor& bias) {
      Shape one = t.shape();
      one[sd] = 1;
      return cat({t, bias.to(t.dtype()).expand(one)}, sd);
    };
    kp = append(kp, bias_k);
    vp = append(vp, bias_v);
  }
  // (A, B, E) -> (N, H, len, head_dim), a view
  const std::vector<int64_t> to_heads = bd == 0 ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 2, 0, 3};
  auto heads = [&](const Tensor& t) { return t.unflatten(-1, {num_heads, head_dim}).permute(to_heads); };
  Tensor kh = heads(kp), vh = heads(vp);
  if (options.add_zero_attn) {  // a zero key and value for each head
    const Tensor zero = zeros({N, num_heads, 1, head_dim}, TensorOptions(kh.dtype(), kh.device()));
    kh = cat({kh, zero}, 2);
    vh = cat({vh, zero}, 2);
  }
  const int64_t extra = kh.size(2) - S;  // keys appended, open to every query

  // masks, combined into one blocking bool mask and/or one additive float mask of (N, H, L, S)
  Tensor blocked, added;
  auto add_mask = [&](const Tensor& m) {
    if (m.dtype() == kBool) blocked = blocked.defined() ? logical_or(blocked, m) : m;
    else added = added.defined() ? added + m : m;
  };
  if (key_padding_mask.defined()) {
    const Shape want = batched ? Shape{N, S} : Shape{S};
    STRATA_CHECK(key_padding_mask.shape() == want, "[{}] key_padding_mask of shape {} should have shape {} (N, S)",
                 me, key_padding_mask.shape(), want);
    add_mask(key_padding_mask.view({N, 1, 1, S}));
  }
  if (attn_mask.defined()) {
    const bool ok2 = attn_mask.dim() == 2 && attn_mask.shape() == Shape{L, S};
    const bool ok3 = attn_mask.dim() == 3 && attn_mask.shape() == Shape{N * num_heads, L, S};
    STRATA_CHECK(ok2 || ok3, "[{}] attn_mask of shape {} should have shape ({}, {}) or ({}, {}, {})", me,
                 attn_mask.shape(), L, S, N * num_heads, L, S);
    add_mask(ok2 ? attn_mask : attn_mask.view({N, num_heads, L, S}));
  }
  for (const Tensor* m : {&key_padding_mask, &attn_mask})
    if (m->defined())
      STRATA_CHECK(m->dtype() == kBool || is_floating(m->dtype()), "[{}] masks must be bool or floating, got {}", me,
                   m->dtype());
  if (extra > 0 && is_causal) {  // as a mask, which the appended keys do not reach
    add_mask(gt(arange(S, TensorOptions(kInt64, qp.device())).unsqueeze(0),
                arange(L, TensorOptions(kInt64, qp.device())).unsqueeze(1)));
    is_causal = false;
  }
  auto open_extra_keys = [&](Tensor& m) {
    if (!m.defined() || extra == 0) return;
    Shape pad = m.shape();
    pad.back() = extra;
    m = cat({m, zeros(pad, TensorOptions(m.dtype(), m.device()))}, -1);  // false, or 0 added
  };
  open_extra_keys(blocked);
  open_extra_keys(added);
  Tensor mask = blocked;
  if (added.defined()) mask = blocked.defined() ? where(blocked, -kInf, added.to(qp.dtype())) : added;

  const double p = is_training() ? options.dropout : 0.0;
  Tensor o = attention(heads(qp), kh, vh, mask, true, is_causal, p, std::nullopt, options.generator, me, weights);
  // (N, H, L, head_dim) -> (A, B, I): the one copy, then out_proj
  o = o.permute(bd == 0 ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{2, 0, 1, 3});
  o = o.reshape(bd == 0 ? Shape{N, L, I} : Shape{L, N, I});
  Tensor out = out_proj(o);
  return batched ? out : out.squeeze(1);
}

}  // namespace strata::nn
