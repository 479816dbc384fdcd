// The built-in parametrizations of torch.nn.utils.parametrizations: weight_norm and
// spectral_norm, registered through nn::parametrize (see nn/parametrize.hpp for how the
// parametrized tensor is recomputed and what an optimizer trains).
//
//   namespace P = strata::nn::utils::parametrizations;
//   nn::Conv2d conv(3, 16, 3);
//   P::weight_norm(conv);          // parametrizations.weight.original0 = g (16,1,1,1), original1 = v
//   nn::Linear critic(128, 1);
//   P::spectral_norm(critic);      // weight / sigma, sigma by power iteration (buffers _u, _v)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/parametrize.hpp>

namespace strata::nn::utils::parametrizations {

/// w = g * v / ||v||, the norm taken over every dim but `dim` (PyTorch's _WeightNorm). The
/// originals are {g, v}: g has v's shape with size 1 in every dim but `dim` (0-d for the whole
/// tensor), v is the direction.
class STRATA_API WeightNorm : public parametrize::Parametrization {
 public:
  /// dim: the dim kept (one norm per index along it); std::nullopt or -1: one norm over the whole
  /// tensor, as PyTorch's None and -1 (-2, -3, ... count from the end).
  explicit WeightNorm(std::optional<int64_t> dim = 0) : dim_(dim.value_or(-1)) {}
  Tensor forward_originals(const std::vector<Tensor>& originals) override;
  bool has_right_inverse() const override { return true; }
  std::vector<Tensor> right_inverse(const Tensor& weight) override;
  std::string name() const override { return "WeightNorm"; }
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;  // -1: the whole tensor
};

/// w / sigma, sigma the largest singular value of w as a matrix (dim `dim` first, the rest
/// flattened), estimated by power iteration (PyTorch's _SpectralNorm). The singular vectors are
/// the buffers _u and _v; each computation in training mode first takes n_power_iterations steps
/// (under no_grad), so sigma sharpens as training goes on, and eval uses them as they are. A 1-d
/// weight is normalized to unit norm.
class STRATA_API SpectralNorm : public parametrize::Parametrization {
 public:
  /// Draws _u and _v (from `gen`, or the default generator) and takes 15 steps on `weight`, as
  /// PyTorch does. Raises when dim is out of range or n_power_iterations < 1.
  SpectralNorm(const Tensor& weight, int64_t n_power_iterations = 1, int64_t dim = 0, double eps = 1e-12,
               Generator* gen = nullptr);
  Tensor forward(const Tensor& weight) override;
  /// The weight itself: the parametrization is applied on top of it.
  bool has_right_inverse() const override { return true; }
  std::vector<Tensor> right_inverse(const Tensor& weight) override { return {weight}; }
  std::string name() const override { return "SpectralNorm"; }

 private:
  Tensor as_matrix(const Tensor& weight) const;  // (size(dim), rest)
  void power_method(const Tensor& weight_mat, int64_t iterations);

  int64_t n_power_iterations_, dim_;
  double eps_;
  Tensor u_, v_;  // buffers _u (rows), _v (columns)
};

/// Registers WeightNorm on module.<name> and returns the module. Raises when there is no such
/// tensor or dim is out of range.
STRATA_API Module& weight_norm(Module& module, const std::string& name = "weight", std::optional<int64_t> dim = 0);

/// Registers SpectralNorm on module.<name> and returns the module. dim defaults to 1 for the
/// transposed convolutions (whose weight is (in, out, ...)) and 0 otherwise, as PyTorch's.
STRATA_API Module& spectral_norm(Module& module, const std::string& name = "weight", int64_t n_power_iterations = 1,
                                 double eps = 1e-12, std::optional<int64_t> dim = std::nullopt,
                                 Generator* gen = nullptr);

}  // namespace strata::nn::utils::parametrizations
