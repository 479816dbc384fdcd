// weight_norm and spectral_norm as parametrizations (nn/parametrizations.hpp), with the math of
// PyTorch's _WeightNorm (torch._weight_norm) and _SpectralNorm.
#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/parametrizations.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::nn::utils::parametrizations {

namespace {

// The 2-norm over every dim of v but `dim` (kept, size 1), or over all of v (0-d) when dim is -1:
// PyTorch's norm_except_dim, where -2, -3, ... count from the end as dims do.
Tensor norm_except_dim(const Tensor& v, int64_t dim) {
  if (dim == -1) return norm(v);
  if (dim < 0) dim += v.dim();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.dim(); ++d)
    if (d != dim) dims.push_back(d);
  if (dims.empty()) return v.abs();  // a 1-d v: one norm per element
  return norm(v, 2, dims, /*keepdim=*/true);
}

void check_weight_norm_dim(int64_t dim, const Tensor& t, const char* what) {
  STRATA_CHECK(dim == -1 || (dim >= -t.dim() && dim < t.dim()), "[weight_norm] dim {} is out of range for {} of "
               "shape {} (expected -1 for the whole tensor, or [{}, {}])", dim, what, t.shape(), -t.dim(), t.dim() - 1);
}

// module.<name> as it reads now: its parameter or buffer, or its parametrized value.
Tensor tensor_named(Module& module, const std::string& name, const char* op) {
  if (parametrize::is_parametrized(module, name)) return parametrize::get(module, name);
  for (auto& [n, t] : module.named_parameters(false))
    if (n == name) return t;
  for (auto& [n, t] : module.named_buffers(false))
    if (n == name) return t;
  detail::throw_error("[{}] {} has no parameter or buffer named \"{}\"", op, module.name(), name);
}

}  // namespace

Tensor WeightNorm::forward_originals(const std::vector<Tensor>& originals) {
  STRATA_CHECK(originals.size() == 2, "[WeightNorm] takes the originals {{g, v}}, got {} tensors", originals.size());
  const Tensor& g = originals[0];
  const Tensor& v = originals[1];
  check_weight_norm_dim(dim_, v, "v");
  return v * (g / norm_except_dim(v, dim_));
}

std::vector<Tensor> WeightNorm::right_inverse(const Tensor& weight) {
  check_weight_norm_dim(dim_, weight, "the weight");
  return {norm_except_dim(weight, dim_), weight};
}

SpectralNorm::SpectralNorm(const Tensor& weight, int64_t n_power_iterations, int64_t dim, double eps, Generator* gen)
    : n_power_iterations_(n_power_iterations), dim_(dim), eps_(eps) {
  const int64_t ndim = weight.dim();
  STRATA_CHECK(dim >= -ndim && dim < ndim, "[spectral_norm] dim {} is out of range for a weight of shape {} "
               "(expected [{}, {}])", dim, weight.shape(), -ndim, ndim - 1);
  STRATA_CHECK(n_power_iterations > 0, "[spectral_norm] n_power_iterations must be positive, got {}",
               n_power_iterations);
  STRATA_CHECK(eps > 0, "[spectral_norm] eps must be positive, got {}", eps);
  if (dim_ < 0) dim_ += ndim;
  if (ndim == 1) return;  // normalized to unit norm: no singular vectors
  NoGradGuard no_grad;
  const Tensor mat = as_matrix(weight);
  const TensorOptions options(weight.dtype(), weight.device());
  u_ = register_buffer("_u", functional::normalize(randn({mat.size(0)}, options, gen), 2, 0, eps_));
  v_ = register_buffer("_v", functional::normalize(randn({mat.size(1)}, options, gen), 2, 0, eps_));
  power_method(mat, 15);
}

Tensor SpectralNorm::as_matrix(const Tensor& weight) const {
  Tensor w = weight;
  if (dim_ != 0) {
    std::vector<int64_t> order{dim_};
    for (int64_t d = 0; d < w.dim(); ++d)
      if (d != dim_) order.push_back(d);
    w = w.permute(order);
  }
  return w.flatten(1);
}

void SpectralNorm::power_method(const Tensor& weight_mat, int64_t iterations) {
  NoGradGuard no_grad;
  // written into the buffers in place, so the state dict and moved copies see the estimate
  for (int64_t i = 0; i < iterations; ++i) {
    u_.copy_(functional::normalize(weight_mat.matmul(v_), 2, 0, eps_));
    v_.copy_(functional::normalize(weight_mat.t().matmul(u_), 2, 0, eps_));
  }
}

Tensor SpectralNorm::forward(const Tensor& weight) {
  if (weight.dim() == 1) return functional::normalize(weight, 2, 0, eps_);
  STRATA_CHECK(u_.defined() && weight.dim() > dim_, "[SpectralNorm] was built for a 1-d weight (or a lower dim) and "
               "got one of shape {}", weight.shape());
  const Tensor mat = as_matrix(weight);
  STRATA_CHECK(mat.size(0) == u_.size(0) && mat.size(1) == v_.size(0), "[SpectralNorm] weight of shape {} does not "
               "match the singular vectors _u ({}) and _v ({})", weight.shape(), u_.shape(), v_.shape());
  if (is_training()) power_method(mat, n_power_iterations_);
  // copies: the next step's in-place update must not change what this graph saved
  const Tensor u = u_.clone(), v = v_.clone();
  const Tensor sigma = (u * mat.matmul(v)).sum();
  return weight / sigma;
}

Module& weight_norm(Module& module, const std::string& name, std::optional<int64_t> dim) {
  const Tensor weight = tensor_named(module, name, "weight_norm");
  auto p = std::make_unique<WeightNorm>(dim);
  check_weight_norm_dim(p->dim(), weight, fmt::format("{}.{}", module.name(), name).c_str());
  parametrize::register_parametrization(module, name, std::move(p));
  return module;
}

Module& spectral_norm(Module& module, const std::string& name, int64_t n_power_iterations, double eps,
                      std::optional<int64_t> dim, Generator* gen) {
  const Tensor weight = tensor_named(module, name, "spectral_norm");
  const bool transposed = dynamic_cast<ConvTranspose1d*>(&module) || dynamic_cast<ConvTranspose2d*>(&module) ||
                          dynamic_cast<ConvTranspose3d*>(&module);
  const int64_t d = dim.value_or(transposed ? 1 : 0);
  parametrize::register_parametrization(module, name,
                                        std::make_unique<SpectralNorm>(weight, n_power_iterations, d, eps, gen));
  return module;
}

}  // namespace strata::nn::utils::parametrizations
