// DTensor ops with sharding propagation: for each mesh dim, the operands' placements decide the
// output's, and operands whose placements do not fit are redistributed first (the cheapest fix:
// a free local chunk, then one collective, Replicate at worst). The op then runs on the local
// pieces with strata's own differentiable ops.
#include <algorithm>

#include <strata/ops/binary.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/unary.hpp>

#include "dtensor_layout.h"

namespace strata::dist {

using namespace dtensor_detail;

namespace dtensor_detail {

// Partial(max) and Partial(min) parts cannot go through a linear op: reduce them first.
Placement linear_or_replicate(const Placement& p) {
  return p.is_partial() && (p.reduce_op == ReduceOp::Max || p.reduce_op == ReduceOp::Min) ? Replicate() : p;
}

// The local piece of `x` laid out as `target`. Where it is Replicate along a mesh dim and the
// output is not, each rank's gradient for it is one part of the whole, all-reduced in backward
// (Megatron's "f": identity forward, all-reduce backward).
Tensor operand(const DTensor& x, const std::vector<Placement>& target, const std::vector<Placement>& out) {
  DLayout layout = DTensorAccess::layout(x);
  Tensor local = redistribute_local(DTensorAccess::local(x), layout, target);
  layout.placements = target;
  std::vector<Placement> grad_from = grad_placements(target);
  for (size_t i = 0; i < target.size(); ++i)
    if (target[i].is_replicate() && !out[i].is_replicate())
      grad_from[i] = Partial(out[i].is_partial() && out[i].reduce_op == ReduceOp::Avg ? ReduceOp::Avg : ReduceOp::Sum);
  return with_grad_layout(local, layout, grad_from, grad_placements(target));
}

DTensor result(const DTensor& like, Tensor local, Shape shape, std::vector<Placement> placements) {
  return DTensorAccess::make(std::move(local), {DTensorAccess::layout(like).mesh, std::move(shape),
                                                std::move(placements)});
}

}  // namespace dtensor_detail

namespace {

using Placements = std::vector<Placement>;

void check_operands(const char* op, const DTensor& a, const DTensor& b) {
  STRATA_CHECK(a.defined() && b.defined(), "[{}] an operand is an undefined DTensor", op);
  STRATA_CHECK(a.device_mesh() == b.device_mesh(),
               "[{}] the operands live on different device meshes (shapes {} and {}); redistribute one first", op,
               a.device_mesh().shape(),
               b.device_mesh().shape());
}

// `x`'s placement along one mesh dim, seen in the dims of a broadcast output `out` (x's dims
// sit `offset` dims to the right); a Shard of a broadcast dim has to be gathered.
Placement in_output(const Placement& p, const Shape& shape, const Shape& out, size_t offset) {
  if (!p.is_shard()) return linear_or_replicate(p);
  const size_t d = static_cast<size_t>(p.dim);
  return shape[d] == out[d + offset] ? Shard(static_cast<int64_t>(d + offset)) : Replicate();
}

// The placement an operand needs for output placement `o` (its own, `own`, in output dims).
Placement target_for(const Placement& o, const Placement& own, const Shape& shape, const Shape& out, size_t offset) {
  if (o.is_shard()) {
    const int64_t d = o.dim - static_cast<int64_t>(offset);
    return d >= 0 && shape[static_cast<size_t>(d)] == out[static_cast<size_t>(o.dim)] ? Shard(d) : Replicate();
  }
  return o.is_partial() && own == o ? o : Replicate();
}

enum class Kind { Additive, Multiplicative };

DTensor elementwise(const char* op, const DTensor& a, const DTensor& b, Kind kind,
                    Tensor (*fn)(const Tensor&, const Tensor&)) {
  check_operands(op, a, b);
  const Shape out = broadcast_shapes(a.shape(), b.shape(), op);
  const size_t off_a = out.size() - a.shape().size(), off_b = out.size() - b.shape().size();
  const int nd = a.device_mesh().ndim();
  Placements ta, tb, to;
  for (int i = 0; i < nd; ++i) {
    const Placement pa = in_output(a.placements()[static_cast<size_t>(i)], a.shape(), out, off_a);
    const Placement pb = in_output(b.placements()[static_cast<size_t>(i)], b.shape(), out, off_b);
    Placement o = Replicate();
    if (pa == pb) {
      // a sum of parts plus a sum of parts is the sum of the parts' sums; a product is not
      o = pa.is_partial() && kind == Kind::Multiplicative ? Replicate() : pa;
    } else if (pa.is_shard() || pb.is_shard()) {
      o = pa.is_shard() ? pa : pb;  // the other operand chunked (free) or reduce-scattered
    } else if (kind == Kind::Multiplicative && (pa.is_partial() != pb.is_partial())) {
      // a partial value times a replicated one: each part scaled
      o = pa.is_partial() ? (pb.is_replicate() ? pa : Replicate()) : (pa.is_replicate() ? pb : Replicate());
    }
    ta.push_back(target_for(o, pa, a.shape(), out, off_a));
    tb.push_back(target_for(o, pb, b.shape(), out, off_b));
    to.push_back(o);
  }
  Tensor local = fn(operand(a, ta, to), operand(b, tb, to));
  return result(a, local, out, to);
}

Tensor add_fn(const Tensor& a, const Tensor& b) { return strata::add(a, b); }
Tensor sub_fn(const Tensor& a, const Tensor& b) { return strata::sub(a, b); }
Tensor mul_fn(const Tensor& a, const Tensor& b) { return strata::mul(a, b); }

// A nonlinear elementwise op: partial values are reduced first, shards and replicas kept.
template <class Fn>
DTensor pointwise(const char* op, const DTensor& x, Fn fn) {
  STRATA_CHECK(x.defined(), "[{}] the input is an undefined DTensor", op);
  Placements target = grad_placements(x.placements());
  return result(x, fn(operand(x, target, target)), x.shape(), target);
}

}  // namespace

DTensor add(const DTensor& a, const DTensor& b) { return elementwise("add", a, b, Kind::Additive, add_fn); }
DTensor sub(const DTensor& a, const DTensor& b) { return elementwise("sub", a, b, Kind::Additive, sub_fn); }
DTensor mul(const DTensor& a, const DTensor& b) { return elementwise("mul", a, b, Kind::Multiplicative, mul_fn); }

DTensor relu(const DTensor& x) {
  return pointwise("relu", x, [](const Tensor& t) { return strata::relu(t); });
}

DTensor gelu(const DTensor& x, std::string_view approximate) {
  return pointwise("gelu", x, [&](const Tensor& t) { return strata::gelu(t, approximate); });
}

DTensor exp(const DTensor& x) {
  return pointwise("exp", x, [](const Tensor& t) { return strata::exp(t); });
}

DTensor tanh(const DTensor& x) {
  return pointwise("tanh", x, [](const Tensor& t) { return strata::tanh(t); });
}

// Linear in x: Partial(sum/avg) parts are scaled as they are; max and min are reduced first,
// except under neg, which turns a max of parts into a min of their negations.
template <class Fn>
DTensor scaled(const char* op, const DTensor& x, bool negates, Fn fn) {
  STRATA_CHECK(x.defined(), "[{}] the input is an undefined DTensor", op);
  Placements target, to;
  for (const Placement& p : x.placements()) {
    const bool extreme = p.is_partial() && (p.reduce_op == ReduceOp::Max || p.reduce_op == ReduceOp::Min);
    target.push_back(extreme && !negates ? Replicate() : p);
    to.push_back(extreme && negates ? Partial(p.reduce_op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max)
                                    : target.back());
  }
  return result(x, fn(operand(x, target, to)), x.shape(), to);
}

DTensor neg(const DTensor& x) {
  return scaled("neg", x, true, [](const Tensor& t) { return strata::neg(t); });
}

DTensor mul(const DTensor& x, Scalar s) {
  return scaled("mul", x, false, [&](const Tensor& t) { return strata::mul(t, s); });
}

DTensor div(const DTensor& x, Scalar s) {
  return scaled("div", x, false, [&](const Tensor& t) { return strata::div(t, s); });
}

// Per mesh dim, in order of preference (a (*, K) @ b (K, N), k = a's last dim):
//   a Shard(d < k)                -> b Replicate, out Shard(d)
//   b Shard(1), a not sharded     -> a Replicate, out Shard(last)
//   a Shard(k) or b Shard(0)      -> a Shard(k), b Shard(0), out Partial(sum)
//   a Partial, b Replicate        -> out Partial (and the mirror case)
//   otherwise                     -> both Replicate
DTensor matmul(const DTensor& a, const DTensor& b) {
  check_operands("matmul", a, b);
  STRATA_CHECK(a.ndim() >= 2 && b.ndim() == 2, "[matmul] DTensor matmul takes a (*, K) with at least 2 dims and b "
               "(K, N), got shapes {} and {}", a.shape(), b.shape());
  STRATA_CHECK(a.size(-1) == b.size(0), "[matmul] shapes {} and {} cannot be multiplied ({} != {})", a.shape(),
               b.shape(), a.size(-1), b.size(0));
  const int64_t k = a.ndim() - 1;
  Shape out = a.shape();
  out.back() = b.size(1);
  Placements ta, tb, to;
  for (size_t i = 0; i < a.placements().size(); ++i) {
    const Placement pa = linear_or_replicate(a.placements()[i]), pb = linear_or_replicate(b.placements()[i]);
    if (pa.is_shard() && pa.dim < k) {
      ta.push_back(pa), tb.push_back(Replicate()), to.push_back(pa);
    } else if (pb.is_shard(1) && !pa.is_shard()) {
      ta.push_back(Replicate()), tb.push_back(pb), to.push_back(Shard(k));
    } else if (pa.is_shard(k) || pb.is_shard(0)) {
      ta.push_back(Shard(k)), tb.push_back(Shard(0)), to.push_back(Partial());
    } else if (pa.is_partial() && pb.is_replicate()) {
      ta.push_back(pa), tb.push_back(pb), to.push_back(pa);
    } else if (pa.is_replicate() && pb.is_partial()) {
      ta.push_back(pa), tb.push_back(pb), to.push_back(pb);
    } else {
      ta.push_back(Replicate()), tb.push_back(Replicate()), to.push_back(Replicate());
    }
  }
  Tensor local = strata::matmul(operand(a, ta, to), operand(b, tb, to));
  return result(a, local, out, to);
}

DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  STRATA_CHECK(x.defined(), "[transpose] the input is an undefined DTensor");
  const int64_t n = x.ndim();
  STRATA_CHECK(dim0 >= -n && dim0 < n && dim1 >= -n && dim1 < n, "[transpose] dims {} and {} are out of range for "
               "{} dims", dim0, dim1, n);
  dim0 = dim0 < 0 ? dim0 + n : dim0;
  dim1 = dim1 < 0 ? dim1 + n : dim1;
  Placements to = x.placements();
  for (Placement& p : to)
    if (p.is_shard()) p.dim = p.dim == dim0 ? dim1 : p.dim == dim1 ? dim0 : p.dim;
  Shape shape = x.shape();
  std::swap(shape[static_cast<size_t>(dim0)], shape[static_cast<size_t>(dim1)]);
  return result(x, DTensorAccess::local(x).transpose(dim0, dim1), shape, to);
}

DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias) {
  check_operands("linear", x, weight);
  STRATA_CHECK(weight.ndim() == 2, "[linear] the weight must be (out_features, in_features), got shape {}",
               weight.shape());
  DTensor y = matmul(x, transpose(weight, 0, 1));
  return bias.defined() ? add(y, bias) : y;
}

DTensor sum(const DTensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  STRATA_CHECK(x.defined(), "[sum] the input is an undefined DTensor");
  const int64_t n = x.ndim();
  std::vector<bool> reduced(static_cast<size_t>(n), dims_in.empty());
  for (int64_t d : dims_in) {
    STRATA_CHECK(d >= -n && d < n, "[sum] dim {} is out of range for {} dims", d, n);
    auto r = reduced[static_cast<size_t>(d < 0 ? d + n : d)];
    STRATA_CHECK(!r, "[sum] dim {} is named twice", d);
    r = true;
  }
  std::vector<int64_t> dims;
  Shape out;
  std::vector<int64_t> new_index(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) {
    new_index[static_cast<size_t>(d)] = static_cast<int64_t>(out.size());
    if (reduced[static_cast<size_t>(d)]) dims.push_back(d);
    if (!reduced[static_cast<size_t>(d)] || keepdim) out.push_back(reduced[static_cast<size_t>(d)] ? 1 : x.size(d));
  }
  Placements target, to;
  for (const Placement& p : x.placements()) {
    target.push_back(linear_or_replicate(p));
    const Placement& t = target.back();
    if (t.is_shard()) {
      to.push_back(reduced[static_cast<size_t>(t.dim)] ? Partial() : Shard(new_index[static_cast<size_t>(t.dim)]));
    } else {
      to.push_back(t);
    }
  }
  Tensor local = operand(x, target, to);
  return result(x, dims.empty() ? local : local.sum(dims, keepdim), out, to);
}

}  // namespace strata::dist
