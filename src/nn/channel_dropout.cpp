// Channel dropout (dropout1d, dropout2d) and its layers: one keep-or-drop draw per (n, c),
// made by the dropout kernel on a tensor of ones shaped (N, C, 1, ...), which gives the scaled
// mask itself; the input times that mask broadcasts it over the channel's elements.
#include <strata/nn/dropout.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

namespace strata::nn {

namespace functional {

namespace {

Tensor channel_dropout(const char* op, const Tensor& x, int64_t spatial_dims, double p, bool training,
                       Generator* gen) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(x.dim() == spatial_dims + 1 || x.dim() == spatial_dims + 2,
               "[{}] expects a {}-d (unbatched) or {}-d input, got shape {}", op, spatial_dims + 1, spatial_dims + 2,
               x.shape());
  STRATA_CHECK(p >= 0 && p <= 1, "[{}] probability must be in [0, 1], got {}", op, p);
  if (!training || p == 0) return x;
  STRATA_CHECK(is_floating(x.dtype()), "[{}] needs a floating input, got {}", op, x.dtype());
  Shape mask_shape(static_cast<size_t>(x.dim()), 1);
  const int64_t channel_dim = x.dim() - spatial_dims - 1;
  for (int64_t d = 0; d <= channel_dim; ++d) mask_shape[static_cast<size_t>(d)] = x.size(d);
  const Tensor mask = dropout(ones(mask_shape, TensorOptions(x.dtype(), x.device())), p, true, gen);
  return x * mask;
}

}  // namespace

Tensor dropout1d(const Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout("dropout1d", x, 1, p, training, gen);
}

Tensor dropout2d(const Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout("dropout2d", x, 2, p, training, gen);
}

}  // namespace functional

Dropout1d::Dropout1d(double p, Generator* gen) : p(p), generator(gen) {
  STRATA_CHECK(p >= 0 && p <= 1, "[Dropout1d] probability must be in [0, 1], got {}", p);
}
Tensor Dropout1d::forward(const Tensor& input) { return functional::dropout1d(input, p, is_training(), generator); }

Dropout2d::Dropout2d(double p, Generator* gen) : p(p), generator(gen) {
  STRATA_CHECK(p >= 0 && p <= 1, "[Dropout2d] probability must be in [0, 1], got {}", p);
}
Tensor Dropout2d::forward(const Tensor& input) { return functional::dropout2d(input, p, is_training(), generator); }

}  // namespace strata::nn
