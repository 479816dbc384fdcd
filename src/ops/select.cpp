// Selections whose size depends on the values (nonzero, masked_select), the tests of whole
// tensors (any, all) and of floating values (isnan, isinf, isfinite, nan_to_num). All are
// composed from ops that have CPU and CUDA kernels, so they run on either device, and
// masked_select and nan_to_num are differentiable through the ops they are made of.
#include <limits>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

namespace strata {

namespace {

void check_defined(const Tensor& x, const char* op) { STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op); }

// x != 0 (bool x as it is).
Tensor nonzero_mask(const Tensor& x) { return x.dtype() == kBool ? x : ne(x, 0); }

// The row-major positions of the true elements of the bool tensor `mask`, ascending, as int64
// on mask's device. Each true element's slot is the running count of trues before it; false
// elements all go to one extra slot, which is cut off.
Tensor true_positions(const Tensor& mask) {
  NoGradGuard no_grad;
  const Tensor flags = mask.flatten().to(kInt64);
  const int64_t n = flags.numel();
  const TensorOptions index_options(kInt64, mask.device());
  if (n == 0) return empty({0}, index_options);
  const Tensor count = cumsum(flags, 0);
  const int64_t found = count[n - 1].item<int64_t>();
  const Tensor slots = where(flags.to(kBool), count - 1, found);
  Tensor out = empty({found + 1}, index_options);
  scatter_(out, 0, slots, arange(n, index_options));
  return out.narrow(0, 0, found);
}

}  // namespace

// Coordinate d of each true element is its row in an (x's shape) grid of arange(size(d)),
// read at the element's position; no division, so exact for any size.
Tensor nonzero(const Tensor& x) {
  check_defined(x, "nonzero");
  NoGradGuard no_grad;
  const Tensor positions = true_positions(nonzero_mask(x));
  const TensorOptions index_options(kInt64, x.device());
  if (x.dim() == 0) return empty({positions.numel(), 0}, index_options);
  std::vector<Tensor> coordinates;
  for (int64_t d = 0; d < x.dim(); ++d) {
    Shape along(static_cast<size_t>(x.dim()), 1);
    along[static_cast<size_t>(d)] = x.size(d);
    const Tensor grid = arange(x.size(d), index_options).view(along).expand(x.shape());
    coordinates.push_back(index_select(grid.reshape({-1}), 0, positions));
  }
  return stack(coordinates, 1);
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  check_defined(x, "masked_select");
  STRATA_CHECK(mask.defined() && mask.dtype() == kBool, "[masked_select] mask must be a bool tensor, got {}",
               mask.defined() ? fmt::format("{}", mask.dtype()) : std::string("undefined"));
  STRATA_CHECK(mask.device() == x.device(), "[masked_select] mask is on {} but the tensor is on {}", mask.device(),
               x.device());
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_select");
  const Tensor positions = true_positions(mask.expand(shape));
  return index_select(x.expand(shape).reshape({-1}), 0, positions);
}

Tensor any(const Tensor& x) {
  check_defined(x, "any");
  return gt(sum(nonzero_mask(x), kInt64), 0);
}
Tensor any(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined(x, "any");
  return gt(sum(nonzero_mask(x), {dim}, keepdim, kInt64), 0);
}
Tensor all(const Tensor& x) {
  check_defined(x, "all");
  return eq(sum(logical_not(nonzero_mask(x)), kInt64), 0);
}
Tensor all(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined(x, "all");
  return eq(sum(logical_not(nonzero_mask(x)), {dim}, keepdim, kInt64), 0);
}

// Integers are never NaN or infinite.
Tensor isnan(const Tensor& x) {
  check_defined(x, "isnan");
  NoGradGuard no_grad;
  return is_floating(x.dtype()) ? ne(x, x) : zeros(x.shape(), TensorOptions(kBool, x.device()));
}
Tensor isinf(const Tensor& x) {
  check_defined(x, "isinf");
  NoGradGuard no_grad;
  return is_floating(x.dtype()) ? eq(abs(x), std::numeric_limits<double>::infinity())
                                : zeros(x.shape(), TensorOptions(kBool, x.device()));
}
Tensor isfinite(const Tensor& x) {
  check_defined(x, "isfinite");
  NoGradGuard no_grad;
  return is_floating(x.dtype()) ? logical_and(eq(x, x), ne(abs(x), std::numeric_limits<double>::infinity()))
                                : ones(x.shape(), TensorOptions(kBool, x.device()));
}

Tensor nan_to_num(const Tensor& x, double nan, std::optional<double> posinf, std::optional<double> neginf) {
  check_defined(x, "nan_to_num");
  if (!is_floating(x.dtype())) return x.clone();
  const double largest = x.dtype() == kFloat64   ? std::numeric_limits<double>::max()
                         : x.dtype() == kFloat32 ? std::numeric_limits<float>::max()
                         : x.dtype() == kFloat16 ? 65504.0
                                                 : 3.3895313892515355e38;  // bfloat16's largest
  const double inf = std::numeric_limits<double>::infinity();
  Tensor y = where(isnan(x), nan, x);
  y = where(eq(x, inf), posinf.value_or(largest), y);
  return where(eq(x, -inf), neginf.value_or(-largest), y);
}

}  // namespace strata
