// The distance functions of nn::functional (cosine_similarity, pairwise_distance, normalize),
// composed of differentiable strata ops with torch.nn.functional's formulas and eps handling.
#include <algorithm>

#include <strata/amp/autocast.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "nn/stable_math.h"

namespace strata::nn::functional {

namespace {

// Both defined, on one device, with a floating common dtype (integers mixed with floats are
// fine, as in PyTorch).
DType check_pair(std::string_view op, const Tensor& x1, const Tensor& x2) {
  STRATA_CHECK(x1.defined() && x2.defined(), "[{}] x1 or x2 is undefined", op);
  STRATA_CHECK(x1.device() == x2.device(), "[{}] x1 is on {} but x2 is on {}", op, x1.device(), x2.device());
  const DType dt = result_type(x1, x2);
  STRATA_CHECK(is_floating(dt), "[{}] needs a floating x1 or x2, got {} and {}", op, x1.dtype(), x2.dtype());
  return dt;
}

}  // namespace

Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim, double eps) {
  amp::detail::AutocastScope amp_scope("cosine_similarity", x1, x2);
  if (amp_scope.cast()) return cosine_similarity(amp_scope[0], amp_scope[1], dim, eps);
  constexpr std::string_view op = "cosine_similarity";
  const DType dt = check_pair(op, x1, x2);
  const Shape shape = broadcast_shapes(x1.shape(), x2.shape(), op);
  const int64_t d = normalize_dim(dim, static_cast<int64_t>(shape.size()), op);
  const Tensor a = x1.to(dt).expand(shape), b = x2.to(dt).expand(shape);
  // Each vector is divided by its norm before the dot product, as PyTorch does, so large ones
  // cannot overflow and |cos| <= 1. The norm is raised to eps with a gradient that passes to the
  // norm unchanged, as PyTorch's clamp under no_grad.
  auto clamped_norm = [&](const Tensor& x) { return detail::clamp_min_keeping_grad(norm(x, 2, {d}, true), eps); };
  return sum((a / clamped_norm(a)) * (b / clamped_norm(b)), {d});
}

Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim) {
  constexpr std::string_view op = "pairwise_distance";
  const DType dt = check_pair(op, x1, x2);
  broadcast_shapes(x1.shape(), x2.shape(), op);
  // the last dim of the broadcast shape; 0-d inputs give |x1 - x2 + eps|
  const int64_t ndim = std::max(x1.dim(), x2.dim());
  const std::vector<int64_t> dims = ndim > 0 ? std::vector<int64_t>{ndim - 1} : std::vector<int64_t>{};
  // eps is added to the difference itself (not to its magnitude), as PyTorch does
  return norm(x1.to(dt) - x2.to(dt) + eps, p, dims, keepdim);
}

Tensor normalize(const Tensor& x, double p, int64_t dim, double eps) {
  constexpr std::string_view op = "normalize";
  STRATA_CHECK(x.defined(), "[{}] x is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] x must be floating, got {}", op, x.dtype());
  const int64_t d = normalize_dim(dim, x.dim(), op);
  return x / clamp(norm(x, p, {d}, true), eps, std::nullopt);
}

}  // namespace strata::nn::functional
