// View ops: shape, strides and offset change, storage is shared. Each records its backward,
// which maps the gradient back to the base's shape (for slices, by writing it into zeros),
// and marks its result a view for in-place ops under autograd.
#include <algorithm>

#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>

#include "autograd/views.h"
#include "core/tensor_internal.h"
#include "ops/view_shape.h"

namespace strata {

using autograd::Grads;
using autograd::Saved;
using detail::make_view;

namespace {

// A view of x that records `backward` for the gradient, then is marked a view of x's base for
// in-place ops under autograd (Note [Views under autograd] in src/autograd/views.cpp). `dims`
// are kept on the node for tools that read the graph (autograd::Node::dims).
template <class Bw>
Tensor recorded_view(const char* name, const Tensor& x, Tensor view, Bw backward, std::vector<int64_t> dims = {}) {
  autograd::record(name, {x}, {view}, {}, [backward](const Grads& g, const Saved&) { return Grads{backward(g[0])}; });
  if (!dims.empty() && view.grad_fn()) view.grad_fn()->dims = std::move(dims);
  autograd::detail::track_view(x, view);
  return view;
}

// The gradient of a view that selects part of x: g written into zeros of x's shape at the
// place `select` picks. Recorded itself, so double backward works.
template <class Select>
Tensor embed_into_zeros(const Tensor& g, const Shape& shape, Select select) {
  Tensor out = zeros(shape, TensorOptions(g.dtype(), g.device()));
  {
    NoGradGuard no_grad;
    select(out).copy_(g);
  }
  autograd::record("view_backward", {g}, {out}, {}, [select](const Grads& gg, const Saved&) { return Grads{select(gg[0])}; });
  return out;
}

template <class Select>
Tensor selecting_view(const char* name, const Tensor& x, Tensor view, Select select) {
  Shape shape = x.shape();
  return recorded_view(name, x, std::move(view), [shape, select](const Tensor& g) {
    return embed_into_zeros(g, shape, select);
  });
}

// True when no two elements of the layout share memory.
bool non_overlapping(const Shape& shape, const Strides& strides) {
  std::vector<size_t> order(shape.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t extent = 0;  // one past the largest offset reached by the dims so far
  for (size_t i : order) {
    if (shape[i] <= 1) continue;
    if (strides[i] < std::max<int64_t>(extent, 1)) return false;
    extent = strides[i] * (shape[i] - 1) + std::max<int64_t>(extent, 1);
  }
  return true;
}

}  // namespace

// Infers a -1 entry and checks the element count (also used by dist::reshape).
Shape infer_shape(const Shape& shape, int64_t numel, std::string_view op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      STRATA_CHECK(infer < 0, "[{}] only one dim may be -1 in {}", op, shape);
      infer = static_cast<int64_t>(i);
    } else {
      STRATA_CHECK(out[i] >= 0, "[{}] invalid size {} in {}", op, out[i], shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    STRATA_CHECK(known != 0 && numel % known == 0, "[{}] cannot infer the -1 in {} for {} elements", op, shape, numel);
    out[infer] = numel / known;
  }
  STRATA_CHECK(checked_numel(out, op) == numel, "[{}] shape {} is invalid for a tensor of {} elements", op, shape,
               numel);
  return out;
}

namespace {

// Strides for viewing (old shape, strides) as new_shape without a copy, if possible (the
// algorithm of NumPy's _attempt_nocopy_reshape): each run of old dims that is contiguous in
// memory maps onto a run of new dims.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  Strides out(new_shape.size());
  int64_t numel = 1;
  for (int64_t s : old_shape) numel *= s;
  // no elements, or a 0-d tensor (whose one element any all-ones shape views)
  if (numel == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, std::optional<int64_t> offset) const {
  int64_t off = offset.value_or(storage_offset());
  detail::check_in_bounds(*storage(), shape, strides, off, dtype(), "as_strided");
  Tensor view = make_view(*this, shape, strides, off);
  if (!autograd::any_requires_grad({this})) {
    autograd::detail::track_view(*this, view);
    return view;
  }
  STRATA_CHECK(is_contiguous() && non_overlapping(shape, strides),
               "[as_strided] gradients flow only through non-overlapping views of contiguous tensors");
  int64_t rel = off - storage_offset();
  return selecting_view("as_strided", *this, view, [shape, strides, rel](const Tensor& t) {
    Tensor c = t.contiguous();  // the layout the strides are of: a gradient may come in any
    return c.as_strided(shape, strides, c.storage_offset() + rel);
  });
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "view");
  auto st = view_strides(this->shape(), strides(), s);
  STRATA_CHECK(st.has_value(), "[view] cannot view a tensor of shape {} and strides {} as {} without a copy; use "
               "reshape", this->shape(), strides(), shape);
  Shape in = this->shape();
  return recorded_view("view", *this, make_view(*this, s, *st, storage_offset()),
                       [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "reshape");
  if (view_strides(this->shape(), strides(), s)) return view(s);
  return contiguous().view(s);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  STRATA_CHECK(static_cast<int64_t>(dims.size()) == dim(), "[permute] {} dims given for a tensor of {} dims", dims.size(),
               dim());
  Shape s(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], dim(), "permute");
    STRATA_CHECK(!seen[d], "[permute] dim {} repeats in {}", d, dims);
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  std::vector<int64_t> order(dims.size()), inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) order[i] = normalize_dim(dims[i], dim(), "permute");
  for (size_t i = 0; i < dims.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return recorded_view(
      "permute", *this, make_view(*this, s, st, storage_offset()),
      [inverse](const Tensor& g) { return g.permute(inverse); }, order);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  int64_t a = normalize_dim(dim0, dim(), "transpose"), b = normalize_dim(dim1, dim(), "transpose");
  if (dim() == 0) return *this;  // dims 0 and -1 name the 0-d tensor itself
  Shape s = shape();
  Strides st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  return recorded_view(
      "transpose", *this, make_view(*this, s, st, storage_offset()),
      [a, b](const Tensor& g) { return g.transpose(a, b); }, {a, b});
}

Tensor Tensor::t() const {
  STRATA_CHECK(dim() <= 2, "[t] expects a tensor of at most 2 dims, got shape {}", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  STRATA_CHECK(dim() > 0, "[slice] cannot slice a 0-d tensor");
  d = normalize_dim(d, dim(), "slice");
  STRATA_CHECK(step > 0, "[slice] step must be positive, got {}", step);
  int64_t n = shape()[d];
  // Python semantics: negative indices count from the end, out-of-range bounds clamp
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape();
  Strides st = strides();
  s[d] = end > start ? (end - start - 1) / step + 1 : 0;  // no overflow whatever the step
  if (s[d] > 1)
    STRATA_CHECK(!__builtin_mul_overflow(strides()[d], step, &st[d]),
                 "[slice] stride {} times step {} overflows int64 (dim {} of shape {})", strides()[d], step, d,
                 shape());
  return selecting_view("slice", *this, make_view(*this, s, st, storage_offset() + start * strides()[d]),
                        [d, start, end, step](const Tensor& t) { return t.slice(d, start, end, step); });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  STRATA_CHECK(dim() > 0, "[narrow] cannot narrow a 0-d tensor");
  d = normalize_dim(d, dim(), "narrow");
  int64_t n = shape()[d];
  if (start < 0) start += n;
  STRATA_CHECK(start >= 0 && length >= 0 && start <= n - length,
               "[narrow] start {} and length {} are out of range for dim {} of size {} (shape {})", start, length, d, n,
               shape());
  Shape s = shape();
  s[d] = length;
  return selecting_view("narrow", *this, make_view(*this, s, strides(), storage_offset() + start * strides()[d]),
                        [d, start, length](const Tensor& t) { return t.narrow(d, start, length); });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  STRATA_CHECK(dim() > 0, "[select] cannot index a 0-d tensor");
  d = normalize_dim(d, dim(), "select");
  int64_t n = shape()[d];
  STRATA_CHECK(index >= -n && index < n, "[select] index {} is out of range for dim {} of size {} (shape {})", index, d,
               n, shape());
  if (index < 0) index += n;
  Shape s = shape();
  Strides st = strides();
  int64_t off = storage_offset() + index * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return selecting_view("select", *this, make_view(*this, s, st, off),
                        [d, index](const Tensor& t) { return t.select(d, index); });
}

Tensor Tensor::expand(const Shape& shape) const {
  STRATA_CHECK(static_cast<int64_t>(shape.size()) >= dim(), "[expand] cannot expand shape {} to fewer dims {}",
               this->shape(), shape);
  size_t lead = shape.size() - static_cast<size_t>(dim());
  Shape s(shape.size());
  Strides st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      STRATA_CHECK(shape[i] >= 0, "[expand] invalid size {} in {}", shape[i], shape);
      s[i] = shape[i];
      continue;
    }
    int64_t cur = this->shape()[i - lead];
    int64_t want = shape[i] == -1 ? cur : shape[i];
    STRATA_CHECK(want == cur || cur == 1, "[expand] cannot expand shape {} to {}", this->shape(), shape);
    s[i] = want;
    st[i] = cur == want ? strides()[i - lead] : 0;  // a broadcast dim reads one element
  }
  checked_numel(s, "expand");
  // the engine sums the gradient back over the expanded dims
  return recorded_view("expand", *this, make_view(*this, s, st, storage_offset()), [](const Tensor& g) { return g; });
}

Tensor Tensor::squeeze() const {
  Shape s;
  Strides st;
  for (int64_t d = 0; d < dim(); ++d)
    if (shape()[d] != 1) {
      s.push_back(shape()[d]);
      st.push_back(strides()[d]);
    }
  Shape in = shape();
  return recorded_view("squeeze", *this, make_view(*this, s, st, storage_offset()),
                       [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (dim() == 0) return *this;
  if (shape()[d] != 1) return *this;
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  Shape in = shape();
  return recorded_view("squeeze", *this, make_view(*this, s, st, storage_offset()),
                       [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  Strides st = strides();
  int64_t new_stride = d < dim() ? st[d] * s[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, new_stride);
  Shape in = shape();
  return recorded_view("unsqueeze", *this, make_view(*this, s, st, storage_offset()),
                       [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) {  // a 0-d tensor flattens as if 1-d: dims -1 and 0 only
    normalize_dim(start_dim, 1, "flatten");
    normalize_dim(end_dim, 1, "flatten");
    return reshape({1});
  }
  int64_t a = normalize_dim(start_dim, dim(), "flatten"), b = normalize_dim(end_dim, dim(), "flatten");
  STRATA_CHECK(a <= b, "[flatten] start_dim {} comes after end_dim {}", start_dim, end_dim);
  Shape s(shape().begin(), shape().begin() + a);
  int64_t m = 1;
  for (int64_t d = a; d <= b; ++d) m *= shape()[d];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + b + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::unflatten(int64_t d, const Shape& sizes) const {
  STRATA_CHECK(dim() > 0, "[unflatten] cannot unflatten a 0-d tensor");
  d = normalize_dim(d, dim(), "unflatten");
  STRATA_CHECK(!sizes.empty(), "[unflatten] sizes must not be empty (dim {} has size {})", d, shape()[d]);
  Shape s(shape().begin(), shape().begin() + d);
  Shape inner = infer_shape(sizes, shape()[d], "unflatten");
  s.insert(s.end(), inner.begin(), inner.end());
  s.insert(s.end(), shape().begin() + d + 1, shape().end());
  return view(s);
}

}  // namespace strata
