// Attention-head pruning by masks: see include/strata/compress/heads.hpp.
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

}  // namespace strata::compress
