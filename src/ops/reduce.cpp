// sum, mean, prod, amax, amin, max/min with indices, argmax and argmin, with the dims
// handling and loop planning every reduction shares. The loops are in kernels/cpu/reduce.h,
// the per-element math in kernels/common/reduce_ops.h.
#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <algorithm>
#include <type_traits>

#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "ops/reduce_grad.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/common/reduce_ops.h"
#include "ops/dispatch.h"
#include "ops/reduce_plan.h"

namespace strata {

namespace detail {

std::vector<int64_t> reduce_dims(const Tensor& x, const std::vector<int64_t>& dims, std::string_view op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  const int64_t nd = x.dim();
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) out.push_back(d);
    return out;
  }
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(nd, 1)), false);
  for (int64_t d : dims) {
    int64_t n = normalize_dim(d, nd, op);
    STRATA_CHECK(!seen[n], "[{}] dim {} appears more than once in dims {}", op, n, dims);
    seen[n] = true;
    if (nd > 0) out.push_back(n);  // a 0-d tensor accepts dim 0 / -1 and reduces nothing
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    bool reduced = std::binary_search(dims.begin(), dims.end(), static_cast<int64_t>(d));
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

int64_t reduced_numel(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

cpu::ReducePlan make_reduce_plan(const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                                 std::string_view op) {
  const int64_t nd = in.dim();
  STRATA_CHECK(nd <= kMaxLoopDims, "[{}] tensors of more than {} dims are not supported", op, kMaxLoopDims);
  const bool keep = out.dim() == nd;
  STRATA_CHECK(keep || out.dim() == nd - static_cast<int64_t>(dims.size()),
               "[{}] output of shape {} does not fit input {} reduced over {}", op, out.shape(), in.shape(), dims);
  struct Dim {
    int64_t size, in, out;
  };
  std::vector<Dim> kept, red;
  int64_t od = 0;
  for (int64_t d = 0; d < nd; ++d) {
    bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    int64_t os = 0;
    if (!reduced || keep) {
      STRATA_CHECK(out.shape()[od] == (reduced ? 1 : in.shape()[d]), "[{}] output of shape {} does not fit input {}",
                   op, out.shape(), in.shape());
      os = out.strides()[od++];
    }
    if (in.shape()[d] != 1) (reduced ? red : kept).push_back({in.shape()[d], in.strides()[d], os});
  }
  // innermost in memory first; ties keep the later logical dim inside
  auto order = [](std::vector<Dim>& v) {
    std::reverse(v.begin(), v.end());
    std::stable_sort(v.begin(), v.end(), [](const Dim& a, const Dim& b) { return a.in < b.in; });
  };
  order(kept);
  order(red);
  cpu::ReducePlan plan;
  for (const Dim& k : kept) {
    plan.num_out *= k.size;
    int n = plan.nkept;
    if (n > 0 && plan.kept_in[n - 1] * plan.kept_size[n - 1] == k.in &&
        plan.kept_out[n - 1] * plan.kept_size[n - 1] == k.out) {
      plan.kept_size[n - 1] *= k.size;
      continue;
    }
    plan.kept_size[n] = k.size;
    plan.kept_in[n] = k.in;
    plan.kept_out[n] = k.out;
    ++plan.nkept;
  }
  for (const Dim& r : red) {
    plan.num_red *= r.size;
    int n = plan.nred;
    if (n > 0 && plan.red_in[n - 1] * plan.red_size[n - 1] == r.in) {
      plan.red_size[n - 1] *= r.size;
      continue;
    }
    plan.red_size[n] = r.size;
    plan.red_in[n] = r.in;
    ++plan.nred;
  }
  return plan;
}

Tensor run_reduction(OpId op, const Tensor& x, const ReduceParams& p, DType out_dtype) {
  Tensor out = make_tensor(reduced_shape(x.shape(), p.dims, p.keepdim), out_dtype, x.device());
  if (out.numel() > 0) run_kernel(op, x.dtype(), KernelCall{{&x, 1}, {&out, 1}, &p});
  return out;
}

}  // namespace detail

namespace {

template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;
// sum and prod of integers and bool give int64
template <class T> using sum_out_t = std::conditional_t<is_float_v<T>, T, int64_t>;

template <template <class> class Op, bool Mean = false>
void cpu_fold(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const auto& p = call.param<ReduceParams>();
  auto plan = detail::make_reduce_plan(x, out, p.dims, op_name(OpId::sum));
  dispatch(x.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Out = sum_out_t<T>;
    using Acc = typename Op<T>::Acc;
    STRATA_CHECK(out.dtype() == dtype_of_v<Out>, "[reduce] output dtype {} should be {}", out.dtype(), dtype_of_v<Out>);
    Out* y = static_cast<Out*>(out.data());
    const Acc count = static_cast<Acc>(plan.num_red);
    cpu::reduce(plan, static_cast<const T*>(x.data()), Op<T>{}, [=](int64_t off, int64_t, Acc acc) {
      if constexpr (Mean) y[off] = convert<Out>(acc / count);
      else y[off] = convert<Out>(acc);
    });
  });
}

template <template <class> class Op>
void cpu_extreme(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  auto plan = detail::make_reduce_plan(x, out, call.param<ReduceParams>().dims, "amax");
  STRATA_CHECK(out.dtype() == x.dtype(), "[amax] output dtype {} should be {}", out.dtype(), x.dtype());
  dispatch(x.dtype(), "amax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* y = static_cast<T*>(out.data());
    cpu::reduce(plan, static_cast<const T*>(x.data()), Op<T>{},
                [=](int64_t off, int64_t, typename Op<T>::Acc acc) { y[off] = convert<T>(acc); });
  });
}

// outputs: int64 indices, and optionally the values (same shape and strides).
template <bool IsMax>
void cpu_arg(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& idx = call.outputs[0];
  auto plan = detail::make_reduce_plan(x, idx, call.param<ReduceParams>().dims, "argmax");
  STRATA_CHECK(plan.nred <= 1, "[argmax] the reduced dims must form one dim in memory");
  STRATA_CHECK(idx.dtype() == kInt64, "[argmax] indices must be int64, got {}", idx.dtype());
  Tensor* vals = call.outputs.size() > 1 ? &call.outputs[1] : nullptr;
  STRATA_CHECK(!vals || (vals->dtype() == x.dtype() && vals->strides() == idx.strides()),
               "[max] values must be {} and laid out like the indices", x.dtype());
  dispatch(x.dtype(), "argmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Op = math::ArgReduce<T, IsMax>;
    int64_t* yi = static_cast<int64_t*>(idx.data());
    T* yv = vals ? static_cast<T*>(vals->data()) : nullptr;
    cpu::reduce(plan, static_cast<const T*>(x.data()), Op{}, [=](int64_t off, int64_t, typename Op::Acc acc) {
      yi[off] = acc.index;
      if (yv) yv[off] = convert<T>(acc.value);
    });
  });
}

ReduceParams params_for(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::string_view op) {
  ReduceParams p;
  p.dims = detail::reduce_dims(x, dims, op);
  p.keepdim = keepdim;
  return p;
}

// For every element, the product of the other elements of its group (the dims `d`), as
// exclusive prefix times exclusive suffix products along the group laid out as one last dim:
// no division, so it holds at zeros and is differentiable everywhere.
Tensor product_of_others(const Tensor& x, const std::vector<int64_t>& d) {
  std::vector<int64_t> perm, inverse(static_cast<size_t>(x.dim()));
  Shape lead;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (!std::binary_search(d.begin(), d.end(), i)) perm.push_back(i), lead.push_back(x.size(i));
  perm.insert(perm.end(), d.begin(), d.end());
  for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  const Tensor xp = x.permute(perm);
  const int64_t n = detail::reduced_numel(x.shape(), d);
  Shape flat = lead, one = lead;
  flat.push_back(n);
  one.push_back(1);
  const Tensor rows = xp.reshape(flat), ones_col = ones(one, TensorOptions().dtype(x.dtype()).device(x.device()));
  const Tensor reversed = arange(n - 1, -1, -1, TensorOptions().dtype(kInt64).device(x.device()));
  const Tensor prefix = cumprod(cat({ones_col, rows.narrow(-1, 0, n - 1)}, -1), -1);
  const Tensor suffix =
      index_select(cumprod(index_select(cat({rows.narrow(-1, 1, n - 1), ones_col}, -1), -1, reversed), -1), -1,
                   reversed);
  return (prefix * suffix).reshape(xp.shape()).permute(inverse);
}

Tensor fold(OpId op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  ReduceParams p = params_for(x, dims, keepdim, op_name(op));
  Tensor in = dtype ? x.to(*dtype) : x;
  DType out = is_floating(in.dtype()) ? in.dtype() : kInt64;
  Tensor r = detail::run_reduction(op, in, p, out);
  if (autograd::any_requires_grad({&in})) {
    std::vector<int64_t> d = p.dims;
    bool keep = p.keepdim;
    Shape shape = in.shape();
    if (op == OpId::prod) {
      // d prod / dx_i = prod / x_i; at a zero, the product of the others: that of the non-zero
      // elements when it is the group's only zero, else 0
      autograd::record("prod", {in}, {r}, {in, r}, [d, keep](const autograd::Grads& g, const autograd::Saved& s) {
        const Tensor& x = s[0];
        const Tensor zero = x == 0, y = detail::unreduce(s[1], d, keep);
        // recorded (create_graph) with a zero present: the product of the others as it stands,
        // so its own derivative is right too (at two zeros the gradient is 0, its derivative not)
        if (autograd::is_grad_enabled() && sum(zero).item<int64_t>() > 0)
          return autograd::Grads{detail::unreduce(g[0], d, keep) * product_of_others(x, d)};
        const Tensor nonzero = where(zero, 1, x);
        const Tensor at_zero = where(sum(zero, d, true) == 1, prod(nonzero, d, true), 0);
        return autograd::Grads{detail::unreduce(g[0], d, keep) * where(zero, at_zero, y / nonzero)};
      });
    } else {
      double scale = op == OpId::mean ? 1.0 / static_cast<double>(std::max<int64_t>(1, detail::reduced_numel(shape, d))) : 1.0;
      autograd::record(op == OpId::mean ? "mean" : "sum", {in}, {r}, {},
                       [d, keep, shape, scale](const autograd::Grads& g, const autograd::Saved&) {
                         Tensor e = detail::unreduce(g[0], d, keep).expand(shape);
                         return autograd::Grads{scale == 1.0 ? e : e * scale};
                       });
    }
  }
  return dtype ? r.to(*dtype) : r;
}

Tensor extreme(OpId op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  ReduceParams p = params_for(x, dims, keepdim, op_name(op));
  STRATA_CHECK(detail::reduced_numel(x.shape(), p.dims) > 0,
               "[{}] cannot reduce over a zero-size dim: the operation has no identity (shape {}, dims {})",
               op_name(op), x.shape(), p.dims);
  Tensor r = detail::run_reduction(op, x, p, x.dtype());
  if (autograd::any_requires_grad({&x})) {
    // the gradient is shared evenly among the elements equal to the extreme, or among the NaNs
    // when the extreme is NaN (x == NaN holds nowhere: 0 / 0 everywhere otherwise)
    autograd::record(op_name(op).data(), {x}, {r}, {x, r}, [d = p.dims, keep = p.keepdim](const autograd::Grads& g,
                                                                                       const autograd::Saved& s) {
      const Tensor extreme = detail::unreduce(s[1], d, keep);
      Tensor mask = logical_or(s[0] == extreme, logical_and(s[0] != s[0], extreme != extreme)).to(s[0].dtype());
      Tensor count = sum(mask, d, true);
      return autograd::Grads{detail::unreduce(g[0], d, keep) * mask / count};
    });
  }
  return r;
}

MinMaxResult arg_reduce(OpId op, const Tensor& x, std::optional<int64_t> dim, bool keepdim, bool with_values) {
  std::string_view name = !with_values ? op_name(op) : op == OpId::argmax ? "max" : "min";  // the caller's name
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", name);
  // the index of a flattened reduction counts in C order: walk a contiguous copy
  Tensor in = dim ? x : x.contiguous();
  ReduceParams p = dim ? params_for(in, {*dim}, keepdim, name) : params_for(in, {}, false, name);
  STRATA_CHECK(detail::reduced_numel(in.shape(), p.dims) > 0,
               "[{}] cannot reduce over a zero-size dim (shape {}, dim {})", name, in.shape(),
               dim ? fmt::format("{}", *dim) : "all");
  Shape shape = detail::reduced_shape(in.shape(), p.dims, p.keepdim);
  Tensor outs[2] = {detail::make_tensor(shape, kInt64, in.device()),
                    with_values ? detail::make_tensor(shape, in.dtype(), in.device()) : Tensor()};
  if (outs[0].numel() > 0) run_kernel(op, in.dtype(), KernelCall{{&in, 1}, {outs, with_values ? 2u : 1u}, &p});
  if (with_values && autograd::any_requires_grad({&in})) {
    // values of max(x, dim): the gradient goes to the chosen index
    int64_t d = p.dims.empty() ? 0 : p.dims[0];
    bool keep = p.keepdim;
    Shape shape = in.shape();
    Tensor values = outs[1];
    autograd::record(op == OpId::argmax ? "max" : "min", {in}, {values}, {outs[0]},
                     [d, keep, shape](const autograd::Grads& g, const autograd::Saved& s) {
                       Tensor idx = keep ? s[0] : s[0].unsqueeze(d);
                       Tensor gv = keep ? g[0] : g[0].unsqueeze(d);
                       return autograd::Grads{scatter(zeros(shape, TensorOptions(gv.dtype(), gv.device())), d, idx, gv)};
                     });
    outs[1] = values;
  }
  return {outs[1], outs[0]};
}

}  // namespace

namespace detail {
void register_reduce_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::sum, CPU, kAllDTypes, cpu_fold<math::SumReduce>);
  table.set(OpId::mean, CPU, kFloatDTypes, cpu_fold<math::SumReduce, true>);
  table.set(OpId::prod, CPU, kAllDTypes, cpu_fold<math::ProdReduce>);
  table.set(OpId::amax, CPU, kAllDTypes, cpu_extreme<math::MaxReduce>);
  table.set(OpId::amin, CPU, kAllDTypes, cpu_extreme<math::MinReduce>);
  table.set(OpId::argmax, CPU, kAllDTypes, cpu_arg<true>);
  table.set(OpId::argmin, CPU, kAllDTypes, cpu_arg<false>);
}
}  // namespace detail

Tensor sum(const Tensor& x, std::optional<DType> dtype) {
  amp::detail::AutocastScope amp_scope("sum", x);
  if (amp_scope.cast()) return fold(OpId::sum, amp_scope[0], {}, false, dtype);
  return fold(OpId::sum, x, {}, false, dtype);
}
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  amp::detail::AutocastScope amp_scope("sum", x);
  if (amp_scope.cast()) return sum(amp_scope[0], dims, keepdim, dtype);
  return fold(OpId::sum, x, dims, keepdim, dtype);
}
Tensor prod(const Tensor& x, std::optional<DType> dtype) {
  amp::detail::AutocastScope amp_scope("prod", x);
  if (amp_scope.cast()) return fold(OpId::prod, amp_scope[0], {}, false, dtype);
  return fold(OpId::prod, x, {}, false, dtype);
}
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  amp::detail::AutocastScope amp_scope("prod", x);
  if (amp_scope.cast()) return prod(amp_scope[0], dims, keepdim, dtype);
  return fold(OpId::prod, x, dims, keepdim, dtype);
}

Tensor mean(const Tensor& x, std::optional<DType> dtype) { return mean(x, {}, false, dtype); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  STRATA_CHECK(x.defined(), "[mean] input tensor is undefined");
  DType t = dtype ? *dtype : x.dtype();
  STRATA_CHECK(is_floating(t),
               "[mean] could not infer the output dtype: the input is {}; pass a floating dtype (e.g. dtype=kFloat32)",
               t);
  return fold(OpId::mean, x, dims, keepdim, t);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(OpId::amax, x, dims, keepdim);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(OpId::amin, x, dims, keepdim);
}
Tensor max(const Tensor& x) { return extreme(OpId::amax, x, {}, false); }
Tensor min(const Tensor& x) { return extreme(OpId::amin, x, {}, false); }
MinMaxResult max(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(OpId::argmax, x, dim, keepdim, true); }
MinMaxResult min(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(OpId::argmin, x, dim, keepdim, true); }
namespace {
// Over all elements with keepdim: a flat index in a tensor of x.dim() ones, as in PyTorch.
Tensor arg_extreme(OpId op, const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Tensor i = arg_reduce(op, x, dim, keepdim, false).indices;
  return !dim && keepdim ? i.reshape(Shape(static_cast<size_t>(x.dim()), 1)) : i;
}
}  // namespace

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(OpId::argmax, x, dim, keepdim);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(OpId::argmin, x, dim, keepdim);
}

Tensor Tensor::sum() const { return strata::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return strata::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return strata::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return strata::mean(*this, dims, keepdim);
}
Tensor Tensor::max() const { return strata::max(*this); }
Tensor Tensor::min() const { return strata::min(*this); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return strata::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const { return strata::argmin(*this, dim, keepdim); }

}  // namespace strata
