// The basic layers: Linear, Embedding, Dropout, GELU, and the normalization layers. Each
// registers its parameters under PyTorch's names, initializes them as PyTorch does, and
// forwards to nn::functional after checking the input against its configuration.
#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/activation.hpp>
#include <strata/nn/dropout.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/init.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/normalization.hpp>
#include <strata/ops/creation.hpp>

namespace strata::nn {

// ---- Linear ------------------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, LinearOptions options) : in_features(in), out_features(out) {
  STRATA_CHECK(in >= 0 && out >= 0, "[Linear] in_features ({}) and out_features ({}) must be non-negative", in, out);
  weight = register_parameter("weight", empty({out, in}));
  if (options.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(options.generator);
}

void Linear::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[Linear] reset_parameters: the float weight was replaced by the form \"{}\"",
               form_.name());
  // kaiming_uniform(a = sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)), the same bound as the bias
  const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  init::uniform_(weight, -bound, bound, gen);
  if (bias.defined()) init::uniform_(bias, -bound, bound, gen);
}

Tensor Linear::forward(const Tensor& input) {
  STRATA_CHECK(input.defined(), "[Linear] input tensor is undefined");
  STRATA_CHECK(input.dim() >= 1 && input.size(-1) == in_features,
               "[Linear(in_features={}, out_features={})] expects an input of shape (*, {}), got {}", in_features,
               out_features, in_features, input.shape());
  if (form_.get()) return form_.get()->forward_layer(*this, input);
  return functional::linear(input, weight, bias);
}

LinearForm& Linear::set_form(std::string name, std::unique_ptr<LinearForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

std::unique_ptr<LinearForm> Linear::take_form() { return form_.take(*this); }

// ---- Embedding ---------------------------------------------------------------------------------

Embedding::Embedding(int64_t num, int64_t dim, EmbeddingOptions options) : num_embeddings(num), embedding_dim(dim) {
  STRATA_CHECK(num >= 0 && dim >= 0, "[Embedding] num_embeddings ({}) and embedding_dim ({}) must be non-negative",
               num, dim);
  if (options.padding_idx) {
    int64_t p = *options.padding_idx;
    STRATA_CHECK(p >= -num && p < num, "[Embedding] padding_idx {} is out of range for {} embeddings", p, num);
    padding_idx = p < 0 ? p + num : p;
  }
  weight = register_parameter("weight", empty({num, dim}));
  reset_parameters(options.generator);
}

void Embedding::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[Embedding] reset_parameters: the float weight was replaced by the form \"{}\"",
               form_.name());
  init::normal_(weight, 0, 1, gen);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight.select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  if (form_.get()) return form_.get()->forward_layer(*this, indices);
  return functional::embedding(indices, weight, padding_idx);
}

EmbeddingForm& Embedding::set_form(std::string name, std::unique_ptr<EmbeddingForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

// ---- Dropout and GELU --------------------------------------------------------------------------

Dropout::Dropout(double p, Generator* gen) : p(p), generator(gen) {
  STRATA_CHECK(p >= 0 && p <= 1, "[Dropout] probability must be in [0, 1], got {}", p);
}

Tensor Dropout::forward(const Tensor& input) { return functional::dropout(input, p, is_training(), generator); }

GELU::GELU(std::string approximate) : approximate(std::move(approximate)) {
  STRATA_CHECK(this->approximate == "none" || this->approximate == "tanh",
               "[GELU] approximate must be \"none\" or \"tanh\", got \"{}\"", this->approximate);
}

// ---- normalization -----------------------------------------------------------------------------

namespace {
void check_trailing(const Tensor& x, const Shape& normalized, std::string_view layer) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", layer);
  const int64_t k = static_cast<int64_t>(normalized.size());
  bool ok = x.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = x.size(x.dim() - k + i) == normalized[i];
  STRATA_CHECK(ok, "[{}(normalized_shape={})] expects an input of shape (*, {}), got {}", layer, normalized,
               fmt::join(normalized, ", "), x.shape());
}
}  // namespace

LayerNorm::LayerNorm(Shape shape, LayerNormOptions opts) : normalized_shape(std::move(shape)), options(opts) {
  STRATA_CHECK(!normalized_shape.empty(), "[LayerNorm] normalized_shape must not be empty");
  for (int64_t d : normalized_shape)
    STRATA_CHECK(d >= 0, "[LayerNorm] normalized_shape {} has a negative size", normalized_shape);
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (options.bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  check_trailing(input, normalized_shape, "LayerNorm");
  return functional::layer_norm(input, normalized_shape, weight, bias, options.eps);
}

RMSNorm::RMSNorm(Shape shape, RMSNormOptions opts) : normalized_shape(std::move(shape)), options(opts) {
  STRATA_CHECK(!normalized_shape.empty(), "[RMSNorm] normalized_shape must not be empty");
  for (int64_t d : normalized_shape)
    STRATA_CHECK(d >= 0, "[RMSNorm] normalized_shape {} has a negative size", normalized_shape);
  if (options.elementwise_affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& input) {
  check_trailing(input, normalized_shape, "RMSNorm");
  return functional::rms_norm(input, normalized_shape, weight, options.eps);
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, GroupNormOptions opts)
    : num_groups(groups), num_channels(channels), options(opts) {
  STRATA_CHECK(groups > 0 && channels >= 0 && channels % groups == 0,
               "[GroupNorm] num_channels ({}) must be divisible by num_groups ({})", channels, groups);
  if (options.affine) {
    weight = register_parameter("weight", ones({channels}));
    bias = register_parameter("bias", zeros({channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& input) {
  STRATA_CHECK(input.defined(), "[GroupNorm] input tensor is undefined");
  STRATA_CHECK(input.dim() >= 2 && input.size(1) == num_channels,
               "[GroupNorm(num_groups={}, num_channels={})] expects an input of shape (N, {}, *), got {}", num_groups,
               num_channels, num_channels, input.shape());
  return functional::group_norm(input, num_groups, weight, bias, options.eps);
}

}  // namespace strata::nn
