// Order statistics: median, nanmedian, quantile and nanquantile, composed of a stable argsort
// (NaNs last, ties in position order, as PyTorch's selection), gather, and for quantile lerp.
// Positions are found with gradient off; the values are gathered from x, so the gradient
// reaches the selected elements (and through lerp, the two elements a quantile lies between).
#include <cmath>
#include <limits>

#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>
#include <strata/ops/statistics.hpp>
#include <strata/ops/unary.hpp>

namespace strata {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Median along `dim`: sorted position (n - 1) / 2 of each row, or of its non-NaN elements
// (ignore_nan; position 0 for a row of NaNs), or for a row holding NaN (median) its first NaN.
MedianResult median_along(const Tensor& x, int64_t dim, bool keepdim, bool ignore_nan, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  const Tensor rows = x.dim() == 0 ? x.reshape({1}) : x;
  const int64_t d = normalize_dim(dim, rows.dim(), op);
  const int64_t n = rows.size(d);
  STRATA_CHECK(n > 0, "[{}] cannot take the median of dim {} of size 0", op, d);
  Tensor position;
  {
    NoGradGuard no_grad;
    const Tensor order = argsort(rows, d, false, true);
    Shape kept = rows.shape();
    kept[static_cast<size_t>(d)] = 1;
    Tensor k = full(kept, (n - 1) / 2, TensorOptions(kInt64, x.device()));
    if (is_floating(x.dtype())) {
      const Tensor nans = sum(isnan(rows), {d}, true, kInt64);
      k = ignore_nan ? floor(div(clamp(Scalar(n - 1) - nans, 0, std::nullopt).to(kFloat64), 2.0)).to(kInt64)
                     : where(gt(nans, 0), Scalar(n) - nans, k);
    }
    position = gather(order, d, k);
  }
  MedianResult r{gather(rows, d, position), position};
  if (x.dim() == 0) return {r.values.reshape({}), r.indices.reshape({})};
  if (!keepdim) return {r.values.squeeze(d), r.indices.squeeze(d)};
  return r;
}

// The median of all elements. Its gradient is shared evenly among the elements equal to it
// (the NaNs for a NaN result), as PyTorch's evenly_distribute_backward.
Tensor median_all(const Tensor& x, bool ignore_nan, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  if (x.numel() == 0) {
    STRATA_CHECK(is_floating(x.dtype()), "[{}] the median of no elements of dtype {} is undefined", op, x.dtype());
    return full({}, kNaN, x.options());
  }
  Tensor m, share;
  const bool records = autograd::any_requires_grad({&x});
  {
    NoGradGuard no_grad;
    m = median_along(x.reshape({-1}), 0, false, ignore_nan, op).values;
    if (records) {
      const Tensor hit = logical_or(eq(x, m), logical_and(isnan(x), isnan(m))).to(x.dtype());
      share = div(hit, sum(hit));
    }
  }
  if (share.defined())
    autograd::record(op, {x}, {m}, {share}, [](const autograd::Grads& g, const autograd::Saved& s) {
      return autograd::Grads{mul(g[0], s[0])};
    });
  return m;
}

enum class Interpolation { Linear, Lower, Higher, Midpoint, Nearest };

Interpolation parse_interpolation(std::string_view s, const char* op) {
  if (s == "linear") return Interpolation::Linear;
  if (s == "lower") return Interpolation::Lower;
  if (s == "higher") return Interpolation::Higher;
  if (s == "midpoint") return Interpolation::Midpoint;
  STRATA_CHECK(s == "nearest", "[{}] interpolation must be linear, lower, higher, midpoint or nearest, got \"{}\"", op,
               s);
  return Interpolation::Nearest;
}

// PyTorch's quantile: the rank q * (n - 1) into each sorted row (n: its non-NaN count for
// nanquantile, the rank clamped at 0 so a row of NaNs reads a NaN; quantile moves the rank of
// a row holding NaN onto its last, NaN, element), rounded or interpolated by the mode.
Tensor quantile_impl(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                     std::string_view interpolation, bool ignore_nan, const char* op) {
  STRATA_CHECK(x.defined() && q.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, "[{}] input must be float32 or float64, got {}", op,
               x.dtype());
  STRATA_CHECK(q.dim() <= 1, "[{}] q must be a scalar or a 1-d tensor, got shape {}", op, q.shape());
  STRATA_CHECK(q.dtype() == x.dtype(), "[{}] q of dtype {} must have the input's dtype {}", op, q.dtype(), x.dtype());
  STRATA_CHECK(q.device() == x.device(), "[{}] q is on {} but the input is on {}", op, q.device(), x.device());
  STRATA_CHECK(x.numel() > 0, "[{}] input tensor must be non-empty", op);
  const Interpolation mode = parse_interpolation(interpolation, op);
  {
    NoGradGuard no_grad;
    STRATA_CHECK(q.numel() == 0 || all(logical_and(ge(q, 0), le(q, 1))).item<bool>(),
                 "[{}] q values must be in the range [0, 1]", op);
  }
  // rows: (batch..., n) with the reduced dim last; kept: the result's dims with keepdim
  Tensor rows;
  Shape kept(static_cast<size_t>(x.dim()), 1);
  if (!dim) {
    rows = x.reshape({-1});
  } else {
    const Tensor xs = x.dim() == 0 ? x.reshape({1}) : x;
    const int64_t d = normalize_dim(*dim, xs.dim(), op);
    std::vector<int64_t> perm;
    for (int64_t k = 0; k < xs.dim(); ++k)
      if (k != d) perm.push_back(k);
    perm.push_back(d);
    rows = xs.permute(perm);
    kept = x.shape();
    if (x.dim() > 0) kept[static_cast<size_t>(d)] = 1;
  }
  const int64_t n = rows.size(-1), nq = q.numel();
  Tensor order;
  {
    NoGradGuard no_grad;
    order = argsort(rows, -1, false, true);
  }
  const Tensor sorted_rows = gather(rows, -1, order);  // recorded: the gradient flows back through it
  Tensor below, above, weight;
  {
    NoGradGuard no_grad;
    const Tensor sorted = sorted_rows.detach();
    Shape q_shape(static_cast<size_t>(rows.dim()) + 1, 1);  // (nq, 1, ..., 1)
    q_shape[0] = nq;
    const Tensor qs = q.reshape(q_shape);
    Tensor rank;  // (nq, batch..., 1)
    if (ignore_nan) {
      const Tensor valid = sum(logical_not(isnan(sorted)), {-1}, true, kInt64).to(x.dtype());
      rank = mul(qs, sub(valid, 1));
      rank = where(lt(rank, 0), 0.0, rank);
    } else {
      rank = where(any(isnan(sorted), -1, true), static_cast<double>(n - 1), mul(qs, static_cast<double>(n - 1)));
    }
    if (mode == Interpolation::Lower) rank = floor(rank);
    if (mode == Interpolation::Higher) rank = ceil(rank);
    if (mode == Interpolation::Nearest) rank = round(rank);
    below = rank.to(kInt64);
    above = ceil(rank).to(kInt64);
    weight = mode == Interpolation::Midpoint ? full_like(rank, 0.5) : sub(rank, below.to(x.dtype()));
  }
  Shape expanded = rows.shape();
  expanded.insert(expanded.begin(), nq);
  const Tensor sorted = sorted_rows.unsqueeze(0).expand(expanded);  // (nq, batch..., n)
  Tensor out = gather(sorted, -1, below);
  if (mode == Interpolation::Linear || mode == Interpolation::Midpoint)
    out = lerp(out, gather(sorted, -1, above), weight);
  Shape result = q.dim() == 1 ? Shape{nq} : Shape{};
  if (keepdim) {
    result.insert(result.end(), kept.begin(), kept.end());
  } else {
    for (int64_t k = 0; k + 1 < rows.dim(); ++k) result.push_back(rows.size(k));
  }
  return out.reshape(result);
}

Tensor q_tensor(const Tensor& x, double q, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  return full({}, q, x.options());
}

}  // namespace

Tensor median(const Tensor& x) { return median_all(x, false, "median"); }
MedianResult median(const Tensor& x, int64_t dim, bool keepdim) {
  return median_along(x, dim, keepdim, false, "median");
}
Tensor nanmedian(const Tensor& x) { return median_all(x, true, "nanmedian"); }
MedianResult nanmedian(const Tensor& x, int64_t dim, bool keepdim) {
  return median_along(x, dim, keepdim, true, "nanmedian");
}

Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim, std::string_view interpolation) {
  return quantile_impl(x, q_tensor(x, q, "quantile"), dim, keepdim, interpolation, false, "quantile");
}
Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, false, "quantile");
}
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl(x, q_tensor(x, q, "nanquantile"), dim, keepdim, interpolation, true, "nanquantile");
}
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, true, "nanquantile");
}

}  // namespace strata
