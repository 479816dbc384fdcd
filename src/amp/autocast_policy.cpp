// Autocast's policy table, the one place that says which op runs in which precision inside a
// region. It follows PyTorch's autocast lists (aten/src/ATen/autocast_mode.cpp): the CUDA list of
// float32 ops is applied on both devices, so the CPU's softmax, norms and exp/log run in float32
// too (PyTorch's CPU list keeps those in bfloat16). Each op named here opens an
// amp::detail::AutocastScope with this name at the top of its public function.
#include <strata/amp/autocast.hpp>

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

namespace strata::amp::detail {

namespace {

using enum CastPolicy;

// Sorted by name (checked once below) for a binary search.
constexpr std::array<std::pair<std::string_view, CastPolicy>, 53> kPolicies{{
    {"acos", Float32},
    {"asin", Float32},
    {"binary_cross_entropy", Float32},
    {"binary_cross_entropy_with_logits", Float32},
    {"bmm", LowerPrecision},
    {"conv2d", LowerPrecision},
    {"conv3d", LowerPrecision},
    {"conv_transpose2d", LowerPrecision},
    {"conv_transpose3d", LowerPrecision},
    {"cosh", Float32},
    {"cosine_embedding_loss", Float32},
    {"cosine_similarity", Float32},
    {"cross_entropy", Float32},
    {"cumprod", Float32},
    {"cumsum", Float32},
    {"einsum", LowerPrecision},
    {"exp", Float32},
    {"expm1", Float32},
    {"group_norm", Float32},
    {"hinge_embedding_loss", Float32},
    {"huber_loss", Float32},
    {"kl_div", Float32},
    {"l1_loss", Float32},
    {"layer_norm", Float32},
    {"linear", LowerPrecision},
    {"linear_gelu", LowerPrecision},
    {"log", Float32},
    {"log10", Float32},
    {"log1p", Float32},
    {"log2", Float32},
    {"log_softmax", Float32},
    {"logsumexp", Float32},
    {"margin_ranking_loss", Float32},
    {"matmul", LowerPrecision},
    {"mm", LowerPrecision},
    {"mse_loss", Float32},
    {"nll_loss", Float32},
    {"norm", Float32},
    {"poisson_nll_loss", Float32},
    {"pow", Float32},
    {"prod", Float32},
    {"reciprocal", Float32},
    {"rms_norm", Float32},
    {"rsqrt", Float32},
    {"scaled_dot_product_attention", LowerPrecision},
    {"sinh", Float32},
    {"smooth_l1_loss", Float32},
    {"soft_margin_loss", Float32},
    {"softmax", Float32},
    {"softplus", Float32},
    {"sum", Float32},
    {"tan", Float32},
    {"triplet_margin_loss", Float32},
}};

}  // namespace

bool policy_of(std::string_view op, CastPolicy& policy) {
  static const bool sorted = std::is_sorted(kPolicies.begin(), kPolicies.end());
  STRATA_CHECK(sorted, "[autocast] the policy table is not sorted by name");
  auto it = std::lower_bound(kPolicies.begin(), kPolicies.end(), op,
                             [](const auto& row, std::string_view name) { return row.first < name; });
  if (it == kPolicies.end() || it->first != op) return false;
  policy = it->second;
  return true;
}

}  // namespace strata::amp::detail
