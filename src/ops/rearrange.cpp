// Rearrangements of a tensor's elements: repeat, tile, repeat_interleave, flip, roll, unbind.
// Each is views plus one copy (reshape, index_select or cat), so it runs on every device and
// its gradient comes from the ops it is made of.
#include <algorithm>

#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>

namespace strata {

namespace {

void check_defined(const Tensor& x, const char* op) { STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  STRATA_CHECK(dim >= -n && dim < n, "[{}] dim {} is out of range for a tensor of {} dims", op, dim, ndim);
  return dim < 0 ? dim + n : dim;
}

}  // namespace

// Dim d of x (left-padded with 1s to repeats' length) becomes [repeats[d], size(d)] by an
// expanded view, and one reshape copies the result.
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  check_defined(x, "repeat");
  const auto n = static_cast<int64_t>(repeats.size());
  STRATA_CHECK(n >= x.dim(), "[repeat] {} repeats for a tensor of {} dims; give at least one per dim", n, x.dim());
  Shape padded(static_cast<size_t>(n - x.dim()), 1);
  padded.insert(padded.end(), x.shape().begin(), x.shape().end());
  Shape interleaved, expanded, result;
  for (size_t d = 0; d < repeats.size(); ++d) {
    STRATA_CHECK(repeats[d] >= 0, "[repeat] repeats must be >= 0, got {} for dim {}", repeats[d], d);
    interleaved.insert(interleaved.end(), {1, padded[d]});
    expanded.insert(expanded.end(), {repeats[d], padded[d]});
    result.push_back(repeats[d] * padded[d]);
  }
  checked_numel(result, "repeat");
  return x.reshape(interleaved).expand(expanded).reshape(result);
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  check_defined(x, "tile");
  std::vector<int64_t> full_reps(static_cast<size_t>(std::max<int64_t>(x.dim() - static_cast<int64_t>(reps.size()), 0)),
                                 1);
  full_reps.insert(full_reps.end(), reps.begin(), reps.end());
  return repeat(x, full_reps);
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim) {
  check_defined(x, "repeat_interleave");
  STRATA_CHECK(repeats >= 0, "[repeat_interleave] repeats must be >= 0, got {}", repeats);
  const Tensor src = dim ? x : x.reshape({-1});
  const int64_t d = dim ? wrap_dim(*dim, x.dim(), "repeat_interleave") : 0;
  if (src.dim() == 0) return repeat(src.reshape({1}), {repeats});
  Shape expanded = src.shape();
  expanded.insert(expanded.begin() + d + 1, repeats);
  Shape result = src.shape();
  result[static_cast<size_t>(d)] *= repeats;
  checked_numel(result, "repeat_interleave");
  return src.unsqueeze(d + 1).expand(expanded).reshape(result);
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "flip");
  Tensor out = x;
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(x.dim(), 1)), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim(dim, x.dim(), "flip");
    STRATA_CHECK(!seen[static_cast<size_t>(d)], "[flip] dim {} appears more than once", d);
    seen[static_cast<size_t>(d)] = true;
    if (x.dim() == 0) continue;
    const int64_t n = x.size(d);
    out = index_select(out, d, arange(n - 1, -1, -1, TensorOptions(kInt64, x.device())));
  }
  return dims.empty() || x.dim() == 0 ? x.clone() : out;
}

// Element i moves to (i + shift) mod size along each dim; without dims, over the flattened
// tensor, keeping its shape.
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  check_defined(x, "roll");
  if (dims.empty()) {
    STRATA_CHECK(shifts.size() == 1, "[roll] without dims takes one shift, got {}", shifts.size());
    return roll(x.reshape({-1}), shifts, {0}).view(x.shape());
  }
  STRATA_CHECK(shifts.size() == dims.size(), "[roll] got {} shifts for {} dims", shifts.size(), dims.size());
  Tensor out = x;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), "roll");
    const int64_t n = x.dim() == 0 ? 1 : x.size(d);
    if (n == 0 || x.dim() == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    out = cat({out.narrow(d, n - s, s), out.narrow(d, 0, n - s)}, d);
  }
  return out.is_same(x) ? x.clone() : out;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  check_defined(x, "unbind");
  STRATA_CHECK(x.dim() > 0, "[unbind] a 0-d tensor has no dim to unbind");
  const int64_t d = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < x.size(d); ++i) parts.push_back(x.select(d, i));
  return parts;
}

}  // namespace strata
