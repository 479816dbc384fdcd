// unique and unique_consecutive, composed of argsort, comparisons, cumsum and nonzero, so they
// run on every device. Without a dim the elements are handled as rows of one column, so one
// path serves both forms: rows are sorted (for unique), a run starts wherever a row differs
// from the one before it, and the run starts give the values, the counts and the inverse.
// Not differentiable, as in PyTorch.
#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>
#include <strata/ops/statistics.hpp>

namespace strata {

namespace {

// The permutation that sorts the rows of an (n, m) tensor lexicographically: stable sorts by
// the last column first, then by each column before it (one argsort per column).
Tensor lexicographic_order(const Tensor& rows) {
  Tensor order = arange(rows.size(0), TensorOptions(kInt64, rows.device()));
  for (int64_t j = rows.size(1); j-- > 0;) {
    const Tensor key = index_select(rows.select(1, j), 0, order);
    order = index_select(order, 0, argsort(key, 0, false, true));
  }
  return order;
}

// True where a row differs from the row before it (and for the first row); NaN differs from NaN.
Tensor run_starts(const Tensor& rows) {
  const int64_t n = rows.size(0);
  const Tensor first = ones({1}, TensorOptions(kBool, rows.device()));
  if (n == 1) return first;
  return cat({first, any(ne(rows.narrow(0, 1, n - 1), rows.narrow(0, 0, n - 1)), 1)});
}

UniqueResult unique_impl(const Tensor& x, bool sort, bool return_inverse, bool return_counts,
                         std::optional<int64_t> dim, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  NoGradGuard no_grad;
  const TensorOptions index_options(kInt64, x.device());
  UniqueResult r;
  // rows: (n, m), the slices to compare; moved: x with dim first
  Tensor rows, moved;
  std::vector<int64_t> perm;
  if (dim) {
    STRATA_CHECK(x.dim() > 0, "[{}] a 0-d tensor has no dim {}", op, *dim);
    const int64_t d = normalize_dim(*dim, x.dim(), op);
    if (x.numel() == 0) {  // as PyTorch: the input's shape, no inverse or counts
      int64_t zero_dims = 0;
      for (int64_t s : x.shape()) zero_dims += s == 0;
      STRATA_CHECK(zero_dims == 1, "[{}] the input has {} dims of size 0; unique along a dim allows one", op,
                   zero_dims);
      r.values = x.clone();
      if (return_inverse) r.inverse = empty({0}, index_options);
      if (return_counts) r.counts = empty({0}, index_options);
      return r;
    }
    perm.push_back(d);
    for (int64_t k = 0; k < x.dim(); ++k)
      if (k != d) perm.push_back(k);
    moved = x.permute(perm);
    rows = moved.reshape({x.size(d), x.numel() / x.size(d)});
  } else {
    rows = x.reshape({x.numel(), 1});
  }
  const int64_t n = rows.size(0);
  const Shape inverse_shape = dim ? Shape{n} : x.shape();
  if (n == 0) {
    r.values = empty({0}, x.options());
    if (return_inverse) r.inverse = empty(inverse_shape, index_options);
    if (return_counts) r.counts = empty({0}, index_options);
    return r;
  }
  const Tensor order = sort ? lexicographic_order(rows) : Tensor();
  const Tensor ordered = sort ? index_select(rows, 0, order) : rows;
  const Tensor starts = run_starts(ordered);
  const Tensor first = nonzero(starts).select(1, 0);  // (G,) where each run begins
  const int64_t groups = first.size(0);
  const Tensor unique_rows = index_select(ordered, 0, first);  // (G, m)
  if (dim) {
    Shape shape = moved.shape();
    shape[0] = groups;
    std::vector<int64_t> back(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) back[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
    r.values = unique_rows.reshape(shape).permute(back).contiguous();
  } else {
    r.values = unique_rows.reshape({groups});
  }
  if (return_inverse) {
    const Tensor run = sub(cumsum(starts, 0), 1);  // the run of each ordered row
    const Tensor inverse = sort ? scatter(empty({n}, index_options), 0, order, run) : run;
    r.inverse = inverse.reshape(inverse_shape);
  }
  if (return_counts) {
    const Tensor ends = cat({first.narrow(0, 1, groups - 1), full({1}, n, index_options)});
    r.counts = sub(ends, first);
  }
  return r;
}

}  // namespace

// `sorted` is accepted for PyTorch compatibility: the result is sorted either way.
UniqueResult unique(const Tensor& x, bool sorted, bool return_inverse, bool return_counts,
                    std::optional<int64_t> dim) {
  (void)sorted;
  return unique_impl(x, true, return_inverse, return_counts, dim, "unique");
}

UniqueResult unique_consecutive(const Tensor& x, bool return_inverse, bool return_counts,
                                std::optional<int64_t> dim) {
  return unique_impl(x, false, return_inverse, return_counts, dim, "unique_consecutive");
}

}  // namespace strata
