// The padding layers and Upsample: the argument counts are checked where the layer is built,
// the input's rank where it runs, naming the layer.
#include <strata/nn/resample.hpp>

namespace strata::nn {

Pad::Pad(std::string name, int64_t spatial_dims, std::vector<int64_t> pad, functional::PadMode m, double v)
    : padding(std::move(pad)), mode(m), value(v), name_(std::move(name)), spatial_dims_(spatial_dims) {
  STRATA_CHECK(padding.size() == static_cast<size_t>(2 * spatial_dims_), "[{}] needs {} padding values, got {}",
               name_, 2 * spatial_dims_, padding.size());
}

Tensor Pad::forward(const Tensor& input) {
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", name_);
  STRATA_CHECK(input.dim() == spatial_dims_ + 1 || input.dim() == spatial_dims_ + 2,
               "[{}] expects a {}-d or {}-d input, got shape {}", name_, spatial_dims_ + 1, spatial_dims_ + 2,
               input.shape());
  return functional::pad(input, padding, mode, value);
}

Upsample::Upsample(functional::InterpolateArgs a) : args(std::move(a)) {
  STRATA_CHECK(args.size.empty() != args.scale_factor.empty(),
               "[Upsample] give exactly one of size and scale_factor (got {} and {} entries)", args.size.size(),
               args.scale_factor.size());
}

Tensor Upsample::forward(const Tensor& input) { return functional::interpolate(input, args); }

}  // namespace strata::nn
