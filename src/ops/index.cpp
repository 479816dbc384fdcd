// index_select, gather, scatter, scatter_add, index_add and one_hot. Two kernels do the work:
// gather (index_select is a gather whose index is broadcast across the other dims) and
// scatter (index_add is a scatter-add whose index is broadcast the same way). Every index
// value is checked before a kernel runs, so a failed call writes nothing. The functional forms
// record their backward, written with these same ops; the in-place forms refuse tensors that
// require grad.
#include <limits>

#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>

#include "autograd/views.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/gather_scatter.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

using autograd::Grads;
using autograd::Saved;
using detail::make_view;

template <class F> decltype(auto) dispatch_index(DType t, F&& f) {
  if (t == kInt64) return f(type_tag<int64_t>{});
  return f(type_tag<int32_t>{});
}

// inputs (x, index), outputs (out of index's shape); IndexParams::dim is the indexed dim.
void cpu_gather(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& index = call.inputs[1];
  Tensor& out = call.outputs[0];
  const int64_t dim = call.param<IndexParams>().dim;
  if (out.numel() == 0) return;
  // x walks the index's positions with its stride along dim taken out; the index puts it back
  Strides xs = x.strides();
  const int64_t x_dim_stride = xs[dim];
  xs[dim] = 0;
  Tensor xv = make_view(x, index.shape(), xs, x.storage_offset());
  auto loop = make_loop<3>(out, {&xv, &index}, "gather");
  dispatch(x.dtype(), "gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      cpu::gather(loop, static_cast<T*>(out.data()), static_cast<const T*>(x.data()),
                  static_cast<const I*>(index.data()), x_dim_stride);
    });
  });
}

// inputs (src, index), outputs (self); src has index's number of dims and is at least as
// large in each (a written value arrives expanded to index's shape).
template <bool Add>
void cpu_scatter(const KernelCall& call) {
  const Tensor& src = call.inputs[0];
  const Tensor& index = call.inputs[1];
  Tensor& self = call.outputs[0];
  const auto& p = call.param<IndexParams>();
  if (index.numel() == 0) return;
  cpu::ScatterDim d{index.size(p.dim), self.stride(p.dim), index.stride(p.dim), src.stride(p.dim), true};
  Shape outer_shape = index.shape();
  outer_shape[p.dim] = 1;
  Tensor sv = make_view(self, outer_shape, self.strides(), self.storage_offset());
  Tensor iv = make_view(index, outer_shape, index.strides(), index.storage_offset());
  Tensor cv = make_view(src, outer_shape, src.strides(), src.storage_offset());
  auto outer = make_loop<3>(sv, {&iv, &cv}, "scatter");
  // walk the dim innermost when it is the faster of self's dims in memory
  d.dim_inner = outer.numel <= 1 || d.self <= outer.strides[0][0];
  dispatch(self.dtype(), "scatter", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      cpu::scatter<Add>(outer, d, static_cast<T*>(self.data()), static_cast<const I*>(index.data()),
                        static_cast<const T*>(src.data()), p.alpha.to<compute_t<T>>());
    });
  });
}

void check_index_dtype(const Tensor& index, std::string_view op) {
  STRATA_CHECK(index.defined(), "[{}] index tensor is undefined", op);
  STRATA_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "[{}] index must be an int64 or int32 tensor, got {}",
               op, index.dtype());
}

void check_defined(const Tensor& t, std::string_view what, std::string_view op) {
  STRATA_CHECK(t.defined(), "[{}] {} tensor is undefined", op, what);
}

void check_device(const Tensor& a, const Tensor& b, std::string_view what, std::string_view op) {
  STRATA_CHECK(a.device() == b.device(), "[{}] {} is on {} but the input is on {}", op, what, b.device(), a.device());
}

// t with its expanded (stride 0) dims narrowed to one element: each stored value once, so a
// huge expanded index is scanned in the time its storage takes.
Tensor stored_values(const Tensor& t) {
  Shape shape = t.shape();
  for (int64_t k = 0; k < t.dim(); ++k)
    if (t.stride(k) == 0) shape[k] = std::min<int64_t>(shape[k], 1);
  return make_view(t, shape, t.strides(), t.storage_offset());
}

// The smallest and largest index value (read from a CPU copy when the index lives elsewhere).
std::pair<int64_t, int64_t> index_range(const Tensor& index) {
  Tensor host = stored_values(index.device().is_cpu() ? index : index.to(kCPU));
  auto loop = make_loop<1>(host, {}, "index");
  int64_t lo = 0, hi = 0;
  dispatch_index(host.dtype(), [&](auto itag) {
    using I = typename decltype(itag)::type;
    cpu::index_min_max(loop, static_cast<const I*>(host.data()), lo, hi);
  });
  return {lo, hi};
}

// CUDA indices are checked by the CUDA kernels themselves, on the device, before they write
// (src/ops/cuda/index.cpp), which spares copying the whole index to the host.
void check_index_values(const Tensor& index, int64_t size, int64_t dim, std::string_view op) {
  if (index.numel() == 0 || index.device().is_cuda()) return;
  auto [lo, hi] = index_range(index);
  STRATA_CHECK(lo >= 0, "[{}] index {} is out of range for dim {} of size {} (negative indices are not allowed)", op,
               lo, dim, size);
  STRATA_CHECK(hi < size, "[{}] index {} is out of range for dim {} of size {}", op, hi, dim, size);
}

// A 0-d tensor is treated as a 1-d tensor of one element, as PyTorch does for these ops.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? make_view(t, {1}, {1}, t.storage_offset()) : t; }

// A view of a 1-d (or 0-d) index with `shape`, stepping along `dim` only.
Tensor broadcast_index(const Tensor& index, const Shape& shape, int64_t dim) {
  Strides st(shape.size(), 0);
  st[dim] = index.dim() == 1 ? index.stride(0) : 0;
  return make_view(index, shape, st, index.storage_offset());
}

using detail::check_writable;

// A read-only operand that shares memory with the destination is copied first, so writes
// cannot change what is still to be read (a scatter writes elsewhere than it reads, so even
// the very same view counts: detail::unaliased's exemption is for elementwise writes).
Tensor unaliased(const Tensor& t, const Tensor& self) { return t.storage() == self.storage() ? t.clone() : t; }

// Runs a checked scatter: self, index and src already validated, dims at least 1.
void run_scatter(OpId op, Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  IndexParams p{dim, alpha};
  Tensor in[2] = {unaliased(src, self), unaliased(index, self)};
  Tensor out = at_least_1d(self);
  run_kernel(op, self.dtype(), KernelCall{in, {&out, 1}, &p});
  self.storage()->bump_version();
}

void check_no_grad(const Tensor& self, const Tensor* src, std::string_view op) {
  bool grad = src ? autograd::detail::inplace_records(self, {src}) : autograd::detail::inplace_records(self);
  STRATA_CHECK(!grad, "[{}] in-place op on a tensor that requires grad; use the "
               "out-of-place op, or run it under NoGradGuard", op);
}

// Checks the shared rules of scatter_ / scatter_add_ and returns the normalized dim.
int64_t check_scatter(const Tensor& self, const Tensor& index, const Tensor* src, int64_t dim, std::string_view op) {
  check_defined(self, "self", op);
  check_no_grad(self, src, op);
  check_index_dtype(index, op);
  check_device(self, index, "index", op);
  Tensor s = at_least_1d(self), ix = at_least_1d(index);
  int64_t d = normalize_dim(dim, s.dim(), op);
  STRATA_CHECK(ix.dim() == s.dim(), "[{}] index of shape {} must have as many dims as self of shape {}", op,
               index.shape(), self.shape());
  for (int64_t k = 0; k < s.dim(); ++k)
    STRATA_CHECK(k == d || ix.size(k) <= s.size(k), "[{}] index of shape {} is larger than self of shape {} in dim {}",
                 op, index.shape(), self.shape(), k);
  if (src) {
    check_defined(*src, "src", op);
    check_device(self, *src, "src", op);
    STRATA_CHECK(src->dtype() == self.dtype(), "[{}] src dtype {} does not match self dtype {}", op, src->dtype(),
                 self.dtype());
    Tensor c = at_least_1d(*src);
    STRATA_CHECK(c.dim() == s.dim(), "[{}] src of shape {} must have as many dims as self of shape {}", op,
                 src->shape(), self.shape());
    for (int64_t k = 0; k < s.dim(); ++k)
      STRATA_CHECK(ix.size(k) <= c.size(k), "[{}] index of shape {} is larger than src of shape {} in dim {}", op,
                   index.shape(), src->shape(), k);
  }
  check_writable(self, op);
  check_index_values(index, s.size(d), d, op);
  return d;
}

}  // namespace

namespace detail {
void register_index_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::gather, CPU, kAllDTypes, cpu_gather);
  table.set(OpId::index_select, CPU, kAllDTypes, cpu_gather);
  table.set(OpId::scatter, CPU, kAllDTypes, cpu_scatter<false>);
  table.set(OpId::scatter_add, CPU, kAllDTypes, cpu_scatter<true>);
  table.set(OpId::index_add, CPU, kAllDTypes, cpu_scatter<true>);
}
}  // namespace detail

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "input", "index_select");
  check_index_dtype(index, "index_select");
  check_device(x, index, "index", "index_select");
  STRATA_CHECK(index.dim() <= 1, "[index_select] index must be 1-d or 0-d, got shape {}", index.shape());
  STRATA_CHECK(x.dim() > 0 || index.numel() == 1, "[index_select] a 0-d input takes exactly one index, got {}",
               index.numel());
  Tensor xs = at_least_1d(x);
  int64_t d = normalize_dim(dim, xs.dim(), "index_select");
  check_index_values(index, xs.size(d), d, "index_select");
  Shape shape = xs.shape();
  shape[d] = index.numel();
  Tensor out = detail::make_tensor(shape, x.dtype(), x.device());
  IndexParams p{d};
  const Tensor in[2] = {xs, broadcast_index(index, shape, d)};
  run_kernel(OpId::index_select, x.dtype(), KernelCall{in, {&out, 1}, &p});
  if (x.dim() == 0) out = out.view({});
  if (autograd::any_requires_grad({&x})) {
    autograd::record("index_select", {x}, {out}, {index}, [shape = x.shape(), dim](const Grads& g, const Saved& s) {
      return Grads{index_add(zeros(shape, TensorOptions(g[0].dtype(), g[0].device())), dim, s[0], g[0])};
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "input", "gather");
  check_index_dtype(index, "gather");
  check_device(x, index, "index", "gather");
  Tensor xs = at_least_1d(x), ix = at_least_1d(index);
  int64_t d = normalize_dim(dim, xs.dim(), "gather");
  STRATA_CHECK(ix.dim() == xs.dim(), "[gather] index of shape {} must have as many dims as the input of shape {}",
               index.shape(), x.shape());
  for (int64_t k = 0; k < xs.dim(); ++k)
    STRATA_CHECK(k == d || ix.size(k) <= xs.size(k),
                 "[gather] index of shape {} is larger than the input of shape {} in dim {}", index.shape(), x.shape(),
                 k);
  check_index_values(index, xs.size(d), d, "gather");
  Tensor out = detail::make_tensor(ix.shape(), x.dtype(), x.device());
  IndexParams p{d};
  const Tensor in[2] = {xs, ix};
  run_kernel(OpId::gather, x.dtype(), KernelCall{in, {&out, 1}, &p});
  if (index.dim() == 0) out = out.view({});
  if (autograd::any_requires_grad({&x})) {
    autograd::record("gather", {x}, {out}, {index}, [shape = x.shape(), dim](const Grads& g, const Saved& s) {
      return Grads{scatter_add(zeros(shape, TensorOptions(g[0].dtype(), g[0].device())), dim, s[0], g[0])};
    });
  }
  return out;
}

namespace {

// The in-place scatter family, named for its error messages by the public form that called it
// (scatter_ or scatter, ...).
Tensor& scatter_src(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, std::string_view op) {
  int64_t d = check_scatter(self, index, &src, dim, op);
  run_scatter(OpId::scatter, self, d, at_least_1d(index), at_least_1d(src), 1);
  return self;
}

Tensor& scatter_value(Tensor& self, int64_t dim, const Tensor& index, Scalar value, std::string_view op) {
  int64_t d = check_scatter(self, index, nullptr, dim, op);
  Tensor ix = at_least_1d(index);
  detail::check_fill_value(value, self.dtype(), op);
  Tensor v = full({}, value, TensorOptions(self.dtype(), self.device())).expand(ix.shape());
  run_scatter(OpId::scatter, self, d, ix, v, 1);
  return self;
}

Tensor& scatter_add_src(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, std::string_view op) {
  int64_t d = check_scatter(self, index, &src, dim, op);
  run_scatter(OpId::scatter_add, self, d, at_least_1d(index), at_least_1d(src), 1);
  return self;
}

Tensor& index_add_src(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha,
                      std::string_view op) {
  check_defined(self, "self", op);
  check_defined(src, "src", op);
  check_no_grad(self, &src, op);
  check_index_dtype(index, op);
  check_device(self, index, "index", op);
  check_device(self, src, "src", op);
  STRATA_CHECK(index.dim() <= 1, "[{}] index must be 1-d or 0-d, got shape {}", op, index.shape());
  STRATA_CHECK(src.dtype() == self.dtype(), "[{}] src dtype {} does not match self dtype {}", op, src.dtype(),
               self.dtype());
  STRATA_CHECK(is_floating(self.dtype()) || !alpha.is_floating(),
               "[{}] alpha must not be a floating value for a {} tensor", op, self.dtype());
  Tensor s = at_least_1d(self), c = at_least_1d(src);
  int64_t d = normalize_dim(dim, s.dim(), op);
  Shape want = s.shape();
  want[d] = index.numel();
  STRATA_CHECK(c.shape() == want, "[{}] src of shape {} must have shape {} (self's shape {} with dim {} of size {})",
               op, src.shape(), want, self.shape(), d, index.numel());
  check_writable(self, op);
  check_index_values(index, s.size(d), d, op);
  run_scatter(OpId::index_add, self, d, broadcast_index(index, want, d), c, alpha);
  return self;
}

// Under autograd the out-of-place op runs instead, and self takes over its result (Note
// [In-place under autograd]); none of their backwards keeps self.
Tensor& recorded_inplace(Tensor& self, const char* op, const std::function<Tensor(const Tensor&)>& out_of_place) {
  check_defined(self, "self", op);
  check_writable(self, op);
  return autograd::record_inplace(self, op, false, out_of_place);
}

}  // namespace

Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (autograd::detail::inplace_records(self, {&src}))
    return recorded_inplace(self, "scatter_", [&](const Tensor& x) { return scatter(x, dim, index, src); });
  return scatter_src(self, dim, index, src, "scatter_");
}

Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, Scalar value) {
  if (autograd::detail::inplace_records(self))
    return recorded_inplace(self, "scatter_", [&](const Tensor& x) { return scatter(x, dim, index, value); });
  return scatter_value(self, dim, index, value, "scatter_");
}

Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (autograd::detail::inplace_records(self, {&src}))
    return recorded_inplace(self, "scatter_add_", [&](const Tensor& x) { return scatter_add(x, dim, index, src); });
  return scatter_add_src(self, dim, index, src, "scatter_add_");
}

Tensor& index_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  if (autograd::detail::inplace_records(self, {&src}))
    return recorded_inplace(self, "index_add_", [&](const Tensor& x) { return index_add(x, dim, index, src, alpha); });
  return index_add_src(self, dim, index, src, alpha, "index_add_");
}

namespace {

// g placed at the leading corner of zeros of `shape`: the gradient for a src larger than its
// index (the rest of src is never read). Recorded, so double backward works.
Tensor pad_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = zeros(shape, TensorOptions(g.dtype(), g.device()));
  {
    NoGradGuard no_grad;
    Tensor corner = out;
    for (int64_t k = 0; k < g.dim(); ++k) corner = corner.narrow(k, 0, g.size(k));
    corner.copy_(g);
  }
  autograd::record("pad_backward", {g}, {out}, {}, [gs = g.shape()](const Grads& gg, const Saved&) {
    Tensor t = gg[0];
    for (size_t k = 0; k < gs.size(); ++k) t = t.narrow(static_cast<int64_t>(k), 0, gs[k]);
    return Grads{t};
  });
  return out;
}

// Runs an in-place form on a copy of x without recording it; the caller records the op.
template <class F>
Tensor out_of_place(const Tensor& x, std::string_view op, F&& inplace) {
  check_defined(x, "input", op);
  NoGradGuard no_grad;
  Tensor out = x.clone();
  inplace(out);
  return out;
}

}  // namespace

// Note: with repeated indices, scatter's src gradient follows PyTorch (every src position
// gets the gradient of the element it points at), although only the last one was written.
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = out_of_place(x, "scatter", [&](Tensor& o) { scatter_src(o, dim, index, src, "scatter"); });
  if (autograd::any_requires_grad({&x, &src})) {
    autograd::record("scatter", {x, src}, {out}, {index}, [dim, ss = src.shape()](const Grads& g, const Saved& s) {
      return Grads{scatter(g[0], dim, s[0], Scalar(0)), pad_to(gather(g[0], dim, s[0]), ss)};
    });
  }
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, Scalar value) {
  Tensor out = out_of_place(x, "scatter", [&](Tensor& o) { scatter_value(o, dim, index, value, "scatter"); });
  if (autograd::any_requires_grad({&x})) {
    autograd::record("scatter", {x}, {out}, {index}, [dim](const Grads& g, const Saved& s) {
      return Grads{scatter(g[0], dim, s[0], Scalar(0))};
    });
  }
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = out_of_place(x, "scatter_add", [&](Tensor& o) { scatter_add_src(o, dim, index, src, "scatter_add"); });
  if (autograd::any_requires_grad({&x, &src})) {
    autograd::record("scatter_add", {x, src}, {out}, {index}, [dim, ss = src.shape()](const Grads& g, const Saved& s) {
      return Grads{g[0], pad_to(gather(g[0], dim, s[0]), ss)};
    });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  Tensor out = out_of_place(x, "index_add", [&](Tensor& o) { index_add_src(o, dim, index, src, alpha, "index_add"); });
  if (autograd::any_requires_grad({&x, &src})) {
    autograd::record("index_add", {x, src}, {out}, {index}, [dim, alpha](const Grads& g, const Saved& s) {
      Tensor gs = index_select(g[0], dim, s[0]);
      return Grads{g[0], alpha.to_double() == 1.0 ? gs : mul(gs, alpha)};
    });
  }
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  check_index_dtype(indices, "one_hot");
  STRATA_CHECK(num_classes >= -1, "[one_hot] num_classes must be -1 or non-negative, got {}", num_classes);
  STRATA_CHECK(num_classes >= 0 || indices.numel() > 0,
               "[one_hot] cannot infer the number of classes from an empty tensor; pass num_classes");
  int64_t classes = num_classes;
  if (indices.numel() > 0) {
    auto [lo, hi] = index_range(indices);
    STRATA_CHECK(lo >= 0, "[one_hot] class index {} is negative", lo);
    if (classes < 0) {
      STRATA_CHECK(hi < std::numeric_limits<int64_t>::max(), "[one_hot] class index {} leaves no room for a count of "
                   "classes; pass num_classes", hi);
      classes = hi + 1;
    }
    STRATA_CHECK(hi < classes, "[one_hot] class index {} is out of range for {} classes", hi, classes);
  }
  Shape shape = indices.shape();
  shape.push_back(classes);
  checked_numel(shape, "one_hot");
  Tensor out = zeros(shape, TensorOptions(kInt64, indices.device()));
  if (out.numel() == 0) return out;
  Tensor ix = indices.unsqueeze(-1);
  Tensor one = full({}, 1, TensorOptions(kInt64, indices.device())).expand(ix.shape());
  run_scatter(OpId::scatter, out, out.dim() - 1, ix, one, 1);
  return out;
}

}  // namespace strata
