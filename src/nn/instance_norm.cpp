// Instance normalization as torch's: batch_norm over the (1, N * C, *) view, with the
// per-channel weight, bias and running statistics repeated for every instance, and the running
// statistics then averaged back over the instances. Both devices and the gradients come from
// batch_norm and the repeat.
#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/instancenorm.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::nn {

namespace functional {

Tensor instance_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, const InstanceNormArgs& args) {
  STRATA_CHECK(input.defined(), "[instance_norm] input tensor is undefined");
  STRATA_CHECK(input.dim() >= 3, "[instance_norm] expects an input of shape (N, C, *) with at least one dim after C, "
               "got shape {}", input.shape());
  const int64_t n = input.size(0), c = input.size(1);
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias})
    STRATA_CHECK(!t->defined() || t->shape() == Shape{c},
                 "[instance_norm] weight, bias and running statistics must have shape ({}), got {}", c, t->shape());
  STRATA_CHECK(args.use_input_stats || (running_mean.defined() && running_var.defined()),
               "[instance_norm] normalizing with running statistics (use_input_stats = false) needs them defined");
  auto per_instance = [n](const Tensor& t) { return t.defined() ? t.repeat({n}) : Tensor(); };
  const Tensor rm = per_instance(running_mean), rv = per_instance(running_var);
  Shape folded = input.shape();
  folded[0] = 1;
  folded[1] = n * c;
  const Tensor y = batch_norm(input.reshape(folded), rm, rv, per_instance(weight), per_instance(bias),
                              {args.use_input_stats, args.momentum, args.eps});
  if (args.use_input_stats && running_mean.defined()) {  // the instances' updates, averaged
    NoGradGuard no_grad;
    running_mean.copy_(mean(rm.view({n, c}), {0}));
    running_var.copy_(mean(rv.view({n, c}), {0}));
  }
  return y.view(input.shape());
}

}  // namespace functional

InstanceNormBase::InstanceNormBase(int64_t n, InstanceNormOptions o, int64_t spatial_dims)
    : num_features(n), options(o), spatial_dims_(spatial_dims) {
  STRATA_CHECK(n > 0, "[InstanceNorm] num_features must be positive, got {}", n);
  STRATA_CHECK(o.eps >= 0, "[InstanceNorm] eps must be non-negative, got {}", o.eps);
  STRATA_CHECK(o.momentum >= 0 && o.momentum <= 1, "[InstanceNorm] momentum must be in [0, 1], got {}", o.momentum);
  if (o.affine) {
    weight = register_parameter("weight", ones({n}));
    bias = register_parameter("bias", zeros({n}));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({n}));
    running_var = register_buffer("running_var", ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

Tensor InstanceNormBase::forward(const Tensor& input) {
  const std::string layer = fmt::format("{}({})", name(), num_features);
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", layer);
  const int64_t rank = input.dim();
  STRATA_CHECK(rank == spatial_dims_ + 1 || rank == spatial_dims_ + 2,
               "[{}] expects a {}-d or {}-d input, got shape {}", layer, spatial_dims_ + 1, spatial_dims_ + 2,
               input.shape());
  const bool unbatched = rank == spatial_dims_ + 1;
  const Tensor x = unbatched ? input.unsqueeze(0) : input;
  STRATA_CHECK(x.size(1) == num_features, "[{}] expects {} channels, got input of shape {}", layer, num_features,
               input.shape());
  const bool use_input_stats = is_training() || !options.track_running_stats;
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  // a single element is its own mean: the normalized value would be 0 and the variance 0
  STRATA_CHECK(!use_input_stats || spatial > 1, "[{}] expects more than 1 spatial element per channel, got input "
               "of shape {}", layer, input.shape());
  const Tensor y = functional::instance_norm(x, running_mean, running_var, weight, bias,
                                             {use_input_stats, options.momentum, options.eps});
  if (is_training() && options.track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return unbatched ? y.squeeze(0) : y;
}

}  // namespace strata::nn
