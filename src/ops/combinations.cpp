// Arithmetic that PyTorch names and strata writes as a few other ops: lerp, addcmul, addcdiv,
// outer, where over two scalars, masked_fill with a 0-d tensor; and the random draws randperm
// and bernoulli. Composed, they run on every device and are differentiable where PyTorch's are.
#include <cmath>
#include <cstdint>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>
#include <strata/ops/unary.hpp>

namespace strata {

// start + weight * (end - start) for weight < 0.5, else end - (end - start) * (1 - weight),
// PyTorch's two forms, exact at both ends.
Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight) {
  STRATA_CHECK(start.defined() && end.defined(), "[lerp] input tensor is undefined");
  const double w = weight.to_double();
  const Tensor diff = end - start;
  return std::fabs(w) < 0.5 ? start + diff * w : end - diff * (1.0 - w);
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  STRATA_CHECK(start.defined() && end.defined() && weight.defined(), "[lerp] input tensor is undefined");
  const Tensor diff = end - start;
  return where(lt(abs(weight), 0.5), start + weight * diff, end - diff * (1 - weight));
}

Tensor addcmul(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value) {
  STRATA_CHECK(x.defined() && t1.defined() && t2.defined(), "[addcmul] input tensor is undefined");
  return x + t1 * t2 * value;
}

Tensor addcdiv(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value) {
  STRATA_CHECK(x.defined() && t1.defined() && t2.defined(), "[addcdiv] input tensor is undefined");
  STRATA_CHECK(is_floating(t1.dtype()) || is_floating(t2.dtype()),
               "[addcdiv] integer division is not supported (tensor1 {}, tensor2 {}); use floating tensors",
               t1.dtype(), t2.dtype());
  return x + t1 / t2 * value;
}

Tensor outer(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.defined() && b.defined(), "[outer] input tensor is undefined");
  STRATA_CHECK(a.dim() == 1 && b.dim() == 1, "[outer] takes two 1-d tensors, got shapes {} and {}", a.shape(),
               b.shape());
  return a.unsqueeze(1) * b.unsqueeze(0);
}

Tensor where(const Tensor& cond, Scalar a, Scalar b) {
  STRATA_CHECK(cond.defined(), "[where] condition tensor is undefined");
  // both scalars: the dtype a tensor of the two would have (float32 for floats, int64 for ints)
  const DType t = promote_types(a.default_dtype(), b.default_dtype());
  return where(cond, scalar_tensor(a, TensorOptions(t, cond.device())), scalar_tensor(b, TensorOptions(t, cond.device())));
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value) {
  STRATA_CHECK(x.defined() && value.defined(), "[masked_fill] input tensor is undefined");
  STRATA_CHECK(value.dim() == 0, "[masked_fill] the value must be a 0-d tensor, got shape {}", value.shape());
  STRATA_CHECK(mask.defined() && mask.dtype() == kBool, "[masked_fill] mask must be a bool tensor");
  const Shape b = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  STRATA_CHECK(b == x.shape(), "[masked_fill] mask of shape {} does not broadcast to the tensor's shape {}",
               mask.shape(), x.shape());
  return where(mask, value.to(x.device(), x.dtype()), x);
}

// The order that sorts n uniform 53-bit keys (randint's widest): a permutation whatever the
// keys (argsort is stable), each equally likely but for ties, of probability below n^2 / 2^54.
Tensor randperm(int64_t n, TensorOptions options, Generator* gen) {
  STRATA_CHECK(n >= 0, "[randperm] n must be >= 0, got {}", n);
  STRATA_CHECK(!is_floating(options.dtype_) || n <= (int64_t{1} << 24),
               "[randperm] {} cannot hold every index below {} exactly", options.dtype_, n);
  NoGradGuard no_grad;
  const Tensor keys = randint(0, int64_t{1} << 53, {n}, TensorOptions(kInt64, options.device_), gen);
  return argsort(keys, 0).to(options.dtype_);
}

Tensor bernoulli(const Tensor& p, Generator* gen) {
  STRATA_CHECK(p.defined() && is_floating(p.dtype()), "[bernoulli] takes a floating tensor of probabilities, got {}",
               p.defined() ? fmt::format("{}", p.dtype()) : std::string("undefined"));
  NoGradGuard no_grad;
  STRATA_CHECK(all(logical_and(ge(p, 0), le(p, 1))).item<bool>(), "[bernoulli] every probability must be in [0, 1]");
  return lt(rand(p.shape(), TensorOptions(p.dtype(), p.device()), gen), p).to(p.dtype());
}

}  // namespace strata
