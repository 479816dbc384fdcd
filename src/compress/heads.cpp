// Attention-head pruning, by masks or by cutting the heads out: see include/strata/compress/heads.hpp.
#include <strata/compress/heads.hpp>

#include <algorithm>

#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

#include "compress/prune_internal.h"

namespace strata::compress {

namespace {

// A mask of `t`'s shape that keeps, along `dim`, the `head_dim`-wide blocks of the heads
// marked in `keep_head`, repeated every num_heads blocks (in_proj_weight stacks q, k and v).
Tensor head_mask(const Tensor& t, int64_t dim, int64_t head_dim, const std::vector<uint8_t>& keep_head) {
  const auto heads = static_cast<int64_t>(keep_head.size());
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < t.dim(); ++d) inner *= t.size(d);
  std::vector<uint8_t> m(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < m.size(); ++i) {
    const int64_t along = (static_cast<int64_t>(i) / inner) % t.size(dim);
    m[i] = keep_head[static_cast<size_t>((along / head_dim) % heads)];
  }
  return from_vector(m, t.shape());
}

}  // namespace

Tensor head_importance(nn::MultiheadAttention& attn, Importance kind) {
  const Tensor& w = attn.out_proj.weight;  // (embed_dim, num_heads * head_dim)
  const Shape by_head{w.size(0), attn.num_heads, attn.head_dim};
  if (kind != Importance::Taylor) return channel_norms(w.detach().view(by_head), kind == Importance::L1 ? 1 : 2, 1);
  STRATA_CHECK(w.grad().defined(), "[head_importance] Taylor importance needs out_proj.weight's gradient: run backward "
               "first");
  return channel_norms((w.detach() * w.grad()).view(by_head), 1, 1);
}

void mask_heads(nn::MultiheadAttention& attn, const std::vector<int64_t>& keep) {
  STRATA_CHECK(!keep.empty(), "[mask_heads] every head would be masked: keep at least one");
  std::vector<uint8_t> keep_head(static_cast<size_t>(attn.num_heads), 0);
  for (int64_t h : keep) {
    STRATA_CHECK(h >= 0 && h < attn.num_heads, "[mask_heads] head {} is out of range for {} heads", h, attn.num_heads);
    keep_head[static_cast<size_t>(h)] = 1;
  }
  for (auto& [name, p] : attn.named_parameters(false))
    if (name != "bias_k" && name != "bias_v") custom_from_mask(attn, name, head_mask(p, 0, attn.head_dim, keep_head));
  custom_from_mask(attn.out_proj, "weight", head_mask(attn.out_proj.weight, 1, attn.head_dim, keep_head));
}

std::vector<int64_t> prune_heads(nn::MultiheadAttention& attn, Amount amount, Importance kind) {
  const std::vector<double> scores = detail::host_values(head_importance(attn, kind));
  // heads masked before are not candidates (as torch's iterative pruning): those whose out_proj
  // columns are all masked
  const Tensor& w = attn.out_proj.weight;
  const std::vector<uint8_t> kept = detail::kept_entries(attn.out_proj, "weight", w);
  std::vector<int64_t> alive;
  for (int64_t h = 0; h < attn.num_heads; ++h) {
    bool any = false;
    for (int64_t r = 0; r < w.size(0) && !any; ++r)
      for (int64_t c = h * attn.head_dim; c < (h + 1) * attn.head_dim && !any; ++c)
        any = kept[static_cast<size_t>(r * w.size(1) + c)] != 0;
    if (any) alive.push_back(h);
  }
  const int64_t k = amount.of(static_cast<int64_t>(alive.size()), "prune_heads");
  STRATA_CHECK(k < static_cast<int64_t>(alive.size()),
               "[prune_heads] pruning all {} remaining heads would leave the attention nothing to compute",
               alive.size());
  const std::vector<int64_t> gone = detail::smallest(scores, alive, k);
  std::vector<int64_t> keep;
  for (int64_t h : alive)
    if (std::find(gone.begin(), gone.end(), h) == gone.end()) keep.push_back(h);
  mask_heads(attn, keep);
  return keep;
}

void remove_heads(nn::MultiheadAttention& attn, const std::vector<int64_t>& heads) {
  const int64_t H = attn.num_heads, hd = attn.head_dim, inner = H * hd;
  std::vector<uint8_t> gone(static_cast<size_t>(H), 0);
  for (int64_t h : heads) {
    STRATA_CHECK(h >= 0 && h < H, "[remove_heads] head {} is out of range for {} heads", h, H);
    gone[static_cast<size_t>(h)] = 1;
  }
  const auto removed = static_cast<int64_t>(std::count(gone.begin(), gone.end(), 1));
  if (removed == 0) return;
  STRATA_CHECK(removed < H, "[remove_heads] removing all {} heads would leave the attention nothing to compute", H);
  // the inner features of the kept heads, and the same within each of in_proj's q, k, v blocks
  std::vector<int64_t> features, stacked;
  for (int64_t h = 0; h < H; ++h)
    if (!gone[static_cast<size_t>(h)])
      for (int64_t d = 0; d < hd; ++d) features.push_back(h * hd + d);
  for (int64_t part = 0; part < 3; ++part)
    for (int64_t f : features) stacked.push_back(part * inner + f);
  const Tensor by_feature = from_vector(features), by_stacked = from_vector(stacked);
  // a parameter and its pruning mask, when it has one, lose the same slices
  auto cut = [](nn::Module& m, const std::string& name, const Tensor& t, int64_t dim, const Tensor& index) {
    if (!t.defined()) return;
    detail::take_slices(t, dim, index);
    detail::take_slices(detail::find_mask(m, name), dim, index);
  };
  cut(attn, "in_proj_weight", attn.in_proj_weight, 0, by_stacked);
  cut(attn, "in_proj_bias", attn.in_proj_bias, 0, by_stacked);
  cut(attn, "q_proj_weight", attn.q_proj_weight, 0, by_feature);
  cut(attn, "k_proj_weight", attn.k_proj_weight, 0, by_feature);
  cut(attn, "v_proj_weight", attn.v_proj_weight, 0, by_feature);
  cut(attn, "bias_k", attn.bias_k, 2, by_feature);
  cut(attn, "bias_v", attn.bias_v, 2, by_feature);
  cut(attn.out_proj, "weight", attn.out_proj.weight, 1, by_feature);
  attn.out_proj.in_features = (H - removed) * hd;
  attn.num_heads = H - removed;
}

}  // namespace strata::compress
