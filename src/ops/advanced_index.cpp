// Advanced indexing (index, index_put, index_put_) and binary search (searchsorted,
// bucketize), composed of nonzero, index_select, scatter, index_add, argsort and cumsum, so
// they run on every device and index / index_put differentiate through those ops.
//
// Note [Advanced indexing through one flat dim]: x's indexed dims are permuted to the front
// and flattened into one dim; the broadcast indices become one linear index into it. Reading
// is then one index_select, writing one scatter (the last colliding write wins, on every
// device) or index_add (accumulate). The whole dims ride along behind.
#include <algorithm>
#include <numeric>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/advanced_index.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>

namespace strata {

namespace {

// The indices resolved against x.
struct IndexPlan {
  std::vector<int64_t> dims;   // indexed dims of x, ascending
  std::vector<Tensor> index;   // one int64 index per entry of dims, wrapped into [0, size)
  Shape shape;                 // the shape the indices broadcast to
  std::vector<int64_t> whole;  // the other dims of x, ascending
  int64_t lead = 0;            // whole dims before the indexed ones in the result
};

// Checks an int index against the size of the dim it addresses, then wraps negative values.
Tensor wrapped(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  if (index.numel() == 0) return index;
  const int64_t lo = amin(index).item<int64_t>(), hi = amax(index).item<int64_t>();
  STRATA_CHECK(lo >= -size, "[{}] index {} is out of range for dim {} of size {}", op, lo, dim, size);
  STRATA_CHECK(hi < size, "[{}] index {} is out of range for dim {} of size {}", op, hi, dim, size);
  return lo < 0 ? where(lt(index, 0), add(index, size), index) : index;
}

IndexPlan plan_indices(const Tensor& x, const TensorIndices& indices, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  NoGradGuard no_grad;
  IndexPlan p;
  int64_t d = 0;
  for (const std::optional<Tensor>& entry : indices) {
    STRATA_CHECK(d < x.dim(), "[{}] too many indices for a tensor of {} dims", op, x.dim());
    if (!entry || !entry->defined()) {  // a whole dim
      ++d;
      continue;
    }
    const Tensor& t = *entry;
    STRATA_CHECK(t.device() == x.device(), "[{}] an index is on {} but the tensor is on {}", op, t.device(),
                 x.device());
    if (t.dtype() == kBool) {
      STRATA_CHECK(t.dim() > 0, "[{}] 0-d bool indices are not supported", op);
      STRATA_CHECK(d + t.dim() <= x.dim(), "[{}] too many indices for a tensor of {} dims", op, x.dim());
      for (int64_t k = 0; k < t.dim(); ++k)
        STRATA_CHECK(t.size(k) == x.size(d + k), "[{}] the bool mask of shape {} does not match the tensor's shape {} "
                     "at dim {}", op, t.shape(), x.shape(), d + k);
      const Tensor coordinates = nonzero(t);  // (count, t.dim())
      for (int64_t k = 0; k < t.dim(); ++k) {
        p.dims.push_back(d + k);
        p.index.push_back(coordinates.select(1, k));
      }
      d += t.dim();
      continue;
    }
    STRATA_CHECK(t.dtype() == kInt64 || t.dtype() == kInt32, "[{}] indices must be int64, int32 or bool tensors, "
                 "got {}", op, t.dtype());
    p.dims.push_back(d);
    p.index.push_back(wrapped(t.to(kInt64), x.size(d), d, op));
    ++d;
  }
  if (p.dims.empty()) return p;
  p.shape = p.index[0].shape();
  for (const Tensor& t : p.index) p.shape = broadcast_shapes(p.shape, t.shape(), op);
  for (int64_t k = 0; k < x.dim(); ++k)
    if (std::find(p.dims.begin(), p.dims.end(), k) == p.dims.end()) p.whole.push_back(k);
  const bool adjacent = p.dims.back() - p.dims.front() + 1 == static_cast<int64_t>(p.dims.size());
  p.lead = adjacent ? p.dims.front() : 0;
  return p;
}

// x as (product of the indexed sizes, whole sizes...), Note [Advanced indexing through one flat dim].
Tensor flat_view(const Tensor& x, const IndexPlan& p) {
  std::vector<int64_t> perm = p.dims;
  perm.insert(perm.end(), p.whole.begin(), p.whole.end());
  Shape flat{1};
  for (int64_t d : p.dims) flat[0] *= x.size(d);
  for (int64_t d : p.whole) flat.push_back(x.size(d));
  return x.permute(perm).reshape(flat);
}

// The linear position of each broadcast index in the flat dim, as a 1-d int64 tensor.
Tensor linear_index(const Tensor& x, const IndexPlan& p) {
  NoGradGuard no_grad;
  Tensor linear = p.index[0];
  for (size_t k = 1; k < p.index.size(); ++k) linear = add(mul(linear, x.size(p.dims[k])), p.index[k]);
  return linear.expand(p.shape).reshape({-1});
}

// Shape of x[indices]: the broadcast shape takes the place of the indexed dims when they are
// adjacent, else comes first.
Shape result_shape(const Tensor& x, const IndexPlan& p) {
  Shape out;
  for (size_t k = 0; k < p.whole.size(); ++k) {
    if (static_cast<int64_t>(k) == p.lead) out.insert(out.end(), p.shape.begin(), p.shape.end());
    out.push_back(x.size(p.whole[k]));
  }
  if (static_cast<int64_t>(p.whole.size()) <= p.lead) out.insert(out.end(), p.shape.begin(), p.shape.end());
  return out;
}

// The permutation from the layout (broadcast dims, whole dims) to result_shape's, or back.
std::vector<int64_t> layout_permutation(const IndexPlan& p, bool to_result) {
  const auto nb = static_cast<int64_t>(p.shape.size()), nw = static_cast<int64_t>(p.whole.size());
  std::vector<int64_t> perm;
  if (to_result) {
    for (int64_t k = 0; k < p.lead; ++k) perm.push_back(nb + k);
    for (int64_t k = 0; k < nb; ++k) perm.push_back(k);
    for (int64_t k = p.lead; k < nw; ++k) perm.push_back(nb + k);
  } else {
    for (int64_t k = 0; k < nb; ++k) perm.push_back(p.lead + k);
    for (int64_t k = 0; k < p.lead; ++k) perm.push_back(k);
    for (int64_t k = p.lead; k < nw; ++k) perm.push_back(nb + k);
  }
  return perm;
}

}  // namespace

Tensor index(const Tensor& x, const TensorIndices& indices) {
  const IndexPlan p = plan_indices(x, indices, "index");
  if (p.dims.empty()) return x.clone();
  const Tensor picked = index_select(flat_view(x, p), 0, linear_index(x, p));  // (N, whole...)
  Shape unflat = p.shape;
  for (int64_t d : p.whole) unflat.push_back(x.size(d));
  return picked.reshape(unflat).permute(layout_permutation(p, true)).contiguous();
}

Tensor index_put(const Tensor& x, const TensorIndices& indices, const Tensor& values, bool accumulate) {
  const IndexPlan p = plan_indices(x, indices, "index_put");
  STRATA_CHECK(values.defined(), "[index_put] values tensor is undefined");
  STRATA_CHECK(values.dtype() == x.dtype(), "[index_put] values dtype {} does not match the tensor's dtype {}",
               values.dtype(), x.dtype());
  STRATA_CHECK(values.device() == x.device(), "[index_put] values are on {} but the tensor is on {}",
               values.device(), x.device());
  const Shape target = p.dims.empty() ? x.shape() : result_shape(x, p);
  STRATA_CHECK(broadcast_shapes(values.shape(), target, "index_put") == target,
               "[index_put] values of shape {} do not broadcast to the indexed shape {}", values.shape(), target);
  if (p.dims.empty()) return accumulate ? add(x, values.expand(target)) : add(zeros_like(x), values.expand(target));
  const Tensor flat = flat_view(x, p);  // (P, whole...)
  const Tensor linear = linear_index(x, p);
  Shape src_shape = flat.shape();
  src_shape[0] = linear.numel();
  const Tensor src = values.expand(target).permute(layout_permutation(p, false)).reshape(src_shape);
  Tensor out;
  if (accumulate) {
    out = index_add(flat, 0, linear, src);
  } else {
    Shape column(src_shape.size(), 1);
    column[0] = linear.numel();
    out = scatter(flat, 0, linear.view(column).expand(src_shape), src);
  }
  // back from (P, whole...) to x's layout
  Shape permuted;
  std::vector<int64_t> order = p.dims;
  order.insert(order.end(), p.whole.begin(), p.whole.end());
  for (int64_t d : order) permuted.push_back(x.size(d));
  std::vector<int64_t> inverse(order.size());
  for (size_t k = 0; k < order.size(); ++k) inverse[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
  return out.reshape(permuted).permute(inverse).contiguous();
}

// Computed out of place, then copied in: bad input raises before self is touched.
Tensor& index_put_(Tensor& self, const TensorIndices& indices, const Tensor& values, bool accumulate) {
  STRATA_CHECK(self.defined(), "[index_put_] input tensor is undefined");
  STRATA_CHECK(!(autograd::is_grad_enabled() && self.is_leaf() && self.requires_grad()),
               "[index_put_] in-place write to a leaf that requires grad; use index_put, or write under NoGradGuard");
  const Tensor result = index_put(self, indices, values, accumulate);
  self.copy_(result);
  return self;
}

// One stable sort of the values and the sequence together: each value's count of sequence
// elements sorted before it is its position. Values are placed first (ties go before equal
// elements: left) or last (after them: right).
Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool right) {
  STRATA_CHECK(sorted_sequence.defined() && values.defined(), "[searchsorted] input tensor is undefined");
  STRATA_CHECK(sorted_sequence.dim() == 1, "[searchsorted] the sorted sequence must be 1-d, got shape {}",
               sorted_sequence.shape());
  STRATA_CHECK(sorted_sequence.device() == values.device(),
               "[searchsorted] the sorted sequence is on {} but the values are on {}", sorted_sequence.device(),
               values.device());
  NoGradGuard no_grad;
  const TensorOptions index_options(kInt64, values.device());
  const int64_t n = values.numel(), m = sorted_sequence.numel();
  if (n == 0 || m == 0) return zeros(values.shape(), index_options);
  const Tensor flat = values.reshape({-1});
  const Tensor joined = right ? cat({sorted_sequence, flat}) : cat({flat, sorted_sequence});
  const Tensor from_sequence = right ? cat({ones({m}, index_options), zeros({n}, index_options)})
                                     : cat({zeros({n}, index_options), ones({m}, index_options)});
  const Tensor order = argsort(joined, 0, false, true);
  const Tensor before = cumsum(index_select(from_sequence, 0, order), 0);  // sequence elements up to here
  const Tensor counts = scatter(empty({n + m}, index_options), 0, order, before);  // in joined order
  return counts.narrow(0, right ? m : 0, n).reshape(values.shape());
}

Tensor bucketize(const Tensor& values, const Tensor& boundaries, bool right) {
  STRATA_CHECK(values.defined() && boundaries.defined(), "[bucketize] input tensor is undefined");
  STRATA_CHECK(boundaries.dim() == 1, "[bucketize] boundaries must be 1-d, got shape {}", boundaries.shape());
  return searchsorted(boundaries, values, right);
}

}  // namespace strata
