// DTensor ops whose sharding depends on the dims they reduce, normalize or reshape: mean,
// softmax, log_softmax, layer_norm, reshape (view, unsqueeze, squeeze) and cross_entropy. A Shard
// of a dim the op must see whole is gathered first (Partial reduced); other shards stay and the
// op runs on the local pieces with strata's differentiable ops.
#include <limits>

#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>

#include "dtensor_layout.h"
#include "ops/view_shape.h"

namespace strata::dist {

using namespace dtensor_detail;
namespace F = nn::functional;

namespace {

using Placements = std::vector<Placement>;

void check_defined(const char* op, const DTensor& x) {
  STRATA_CHECK(x.defined(), "[{}] the input is an undefined DTensor", op);
}

void check_same_mesh(const char* op, const DTensor& a, const DTensor& b) {
  STRATA_CHECK(a.device_mesh() == b.device_mesh(), "[{}] the operands live on different device meshes (shapes {} and "
               "{}); redistribute one first", op, a.device_mesh().shape(), b.device_mesh().shape());
}

// x's placements with Partial reduced and the Shards of the dims the op needs whole gathered.
template <class Whole>
Placements gathering(const DTensor& x, Whole whole) {
  Placements out = grad_placements(x.placements());
  for (Placement& p : out)
    if (p.is_shard() && whole(p.dim)) p = Replicate();
  return out;
}

template <class Fn>
DTensor along_dim(const char* op, const DTensor& x, int64_t dim, Fn fn) {
  check_defined(op, x);
  dim = normalize_dim(dim, std::max<int64_t>(x.ndim(), 1), op);
  Placements target = gathering(x, [&](int64_t d) { return d == dim; });
  return result(x, fn(operand(x, target, target), dim), x.shape(), target);
}

// A run of input dims [in0, in1) holding the same elements as output dims [out0, out1) (one side
// may be empty for a size-1 dim that appears or goes).
struct Group {
  size_t in0, in1, out0, out1;
};

// The minimal runs of dims with equal products, left to right (no size is 0).
std::vector<Group> view_groups(const Shape& in, const Shape& out) {
  std::vector<Group> groups;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    const bool in_one = i < in.size() && in[i] == 1, out_one = j < out.size() && out[j] == 1;
    if (i < in.size() && (j == out.size() || (in_one && !out_one))) {
      groups.push_back({i, i + 1, j, j}), ++i;
    } else if (i == in.size() || (out_one && !in_one)) {
      groups.push_back({i, i, j, j + 1}), ++j;
    } else {
      Group g{i, i, j, j};
      int64_t pi = in[i++], po = out[j++];
      while (pi != po) pi < po ? pi *= in[i++] : po *= out[j++];
      g.in1 = i, g.out1 = j;
      groups.push_back(g);
    }
  }
  return groups;
}

// Where x's Shard(d) along each mesh dim goes in the reshaped `out`: kept when d is the leading
// dim of its group and the group's leading sizes split evenly (then the local piece is one
// contiguous run of the group's elements either way), else Replicate (gathered first).
Placements reshaped(const DTensor& x, const Shape& out, Placements& target) {
  target = x.placements();  // a reshape moves parts as they are: Partial stays
  Placements to = target;
  if (x.numel() == 0) {
    for (size_t m = 0; m < to.size(); ++m)
      if (to[m].is_shard()) target[m] = to[m] = Replicate();
    return to;
  }
  const std::vector<Group> groups = view_groups(x.shape(), out);
  auto group_of = [&](int64_t d) {
    for (const Group& g : groups)
      if (static_cast<size_t>(d) >= g.in0 && static_cast<size_t>(d) < g.in1) return g;
    return Group{};
  };
  for (size_t m = 0; m < to.size(); ++m) {
    if (!target[m].is_shard()) continue;
    const Group g = group_of(target[m].dim);
    const int64_t n = x.device_mesh().size(static_cast<int>(m));
    bool keep = g.out1 > g.out0 && static_cast<size_t>(target[m].dim) == g.in0;
    if (keep && (g.in1 - g.in0 != 1 || g.out1 - g.out0 != 1)) {
      keep = x.shape()[g.in0] % n == 0 && out[g.out0] % n == 0;
      for (size_t k = 0; k < target.size(); ++k)  // another mesh dim cutting the group nests its pieces
        if (k != m && target[k].is_shard() && static_cast<size_t>(target[k].dim) >= g.in0 &&
            static_cast<size_t>(target[k].dim) < g.in1)
          keep = false;
    }
    to[m] = keep ? Shard(static_cast<int64_t>(g.out0)) : Replicate();
  }
  for (size_t m = 0; m < to.size(); ++m)
    if (to[m].is_replicate()) target[m] = Replicate();
  return to;
}

}  // namespace

DTensor mean(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("mean", x);
  STRATA_CHECK(is_floating(x.dtype()), "[mean] takes a floating DTensor, got {}", x.dtype());
  DTensor s = sum(x, dims, keepdim);  // checks the dims
  int64_t count = dims.empty() ? x.numel() : 1;
  for (int64_t d : dims) count *= x.size(d);
  return div(s, static_cast<double>(count));
}

DTensor softmax(const DTensor& x, int64_t dim) {
  return along_dim("softmax", x, dim, [](const Tensor& t, int64_t d) { return strata::softmax(t, d); });
}

DTensor log_softmax(const DTensor& x, int64_t dim) {
  return along_dim("log_softmax", x, dim, [](const Tensor& t, int64_t d) { return strata::log_softmax(t, d); });
}

DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const DTensor& weight, const DTensor& bias,
                   double eps) {
  check_defined("layer_norm", x);
  const auto k = static_cast<int64_t>(normalized_shape.size());
  STRATA_CHECK(k >= 1 && k <= x.ndim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
               "[layer_norm] normalized_shape {} is not the trailing dims of the input's shape {}",
               normalized_shape, x.shape());
  for (const DTensor* p : {&weight, &bias})
    if (p->defined()) {
      check_same_mesh("layer_norm", x, *p);
      STRATA_CHECK(p->shape() == normalized_shape, "[layer_norm] weight and bias must have normalized_shape {}, got "
                   "{}", normalized_shape, p->shape());
    }
  const int64_t first = x.ndim() - k;
  Placements target = gathering(x, [&](int64_t d) { return d >= first; });
  const Placements replicated(target.size(), Replicate());
  auto param = [&](const DTensor& p) { return p.defined() ? operand(p, replicated, target) : Tensor(); };
  Tensor local = F::layer_norm(operand(x, target, target), normalized_shape, param(weight), param(bias), eps);
  return result(x, local, x.shape(), target);
}

DTensor reshape(const DTensor& x, const Shape& shape) {
  check_defined("reshape", x);
  const Shape out = infer_shape(shape, x.numel(), "reshape");
  Placements target;
  Placements to = reshaped(x, out, target);
  Tensor local = operand(x, target, to);
  return result(x, local.reshape(local_shape(out, to, x.device_mesh())), out, to);
}

DTensor unsqueeze(const DTensor& x, int64_t dim) {
  check_defined("unsqueeze", x);
  Shape out = x.shape();
  dim = normalize_dim(dim, x.ndim() + 1, "unsqueeze");
  out.insert(out.begin() + dim, 1);
  return reshape(x, out);
}

DTensor squeeze(const DTensor& x, std::optional<int64_t> dim) {
  check_defined("squeeze", x);
  Shape out;
  const int64_t d = dim ? normalize_dim(*dim, std::max<int64_t>(x.ndim(), 1), "squeeze") : -1;
  for (int64_t i = 0; i < x.ndim(); ++i)
    if (x.size(i) != 1 || (dim && i != d)) out.push_back(x.size(i));
  return reshape(x, out);
}

DTensor cross_entropy(const DTensor& input, const DTensor& target, const F::CrossEntropyOptions& options) {
  STRATA_CHECK(input.defined() && target.defined(), "[cross_entropy] an operand is an undefined DTensor");
  check_same_mesh("cross_entropy", input, target);
  STRATA_CHECK(input.ndim() == 2, "[cross_entropy] DTensor cross_entropy takes logits (N, C), got shape {}",
               input.shape());
  const bool indices = target.ndim() == 1;
  STRATA_CHECK(indices ? target.size(0) == input.size(0) : target.shape() == input.shape(),
               "[cross_entropy] the target must be class indices (N) or probabilities (N, C) for logits {}, got {}",
               input.shape(), target.shape());
  const std::string& reduction = options.reduction;
  STRATA_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none",
               "[cross_entropy] reduction must be 'mean', 'sum' or 'none', got '{}'", reduction);
  // the batch stays cut where either operand cuts it (the other is chunked or all-to-all'ed)
  Placements tin, ttarget, to, batch;
  for (size_t m = 0; m < input.placements().size(); ++m) {
    const bool cut = input.placements()[m].is_shard(0) || target.placements()[m].is_shard(0);
    tin.push_back(cut ? Shard(0) : Replicate());
    ttarget.push_back(cut ? Shard(0) : Replicate());
    batch.push_back(cut ? Partial() : Replicate());
    to.push_back(cut && reduction == "none" ? Shard(0) : batch.back());
  }
  Tensor x = operand(input, tin, to), t = operand(target, ttarget, to);
  // torch's mean divides by the summed weights of the targets that count. That sum's parts are
  // gathered before the local loss, with the count of out-of-range labels: a bad label on one rank
  // then raises on every rank instead of leaving the others waiting in the all-reduce.
  Tensor count = full({}, static_cast<double>(input.size(0)), TensorOptions(x.dtype()).device(x.device()));
  if (reduction == "mean" && indices) {
    const Tensor labels = t.detach();
    const Tensor bad = logical_and(labels != options.ignore_index,
                                   logical_or(lt(labels, 0), ge(labels, input.size(1))));
    Tensor part = F::nll_loss(full_like(x.detach(), -1.0), where(bad, Scalar(options.ignore_index), labels),
                              {options.weight.defined() ? options.weight.detach() : Tensor(), options.ignore_index,
                               "sum"});
    Tensor parts = stack({part, bad.sum().to(x.dtype())});
    Tensor whole = DTensor::from_local(parts, input.device_mesh(), batch, false, Shape{2}).full_tensor();
    STRATA_CHECK(whole[1].item<double>() == 0, "[cross_entropy] {} target class indices are out of range for {} "
                 "classes (ignore_index is {})", whole[1].item<double>(), input.size(1), options.ignore_index);
    count = whole[0];
  }
  F::CrossEntropyOptions local_options = options;
  local_options.reduction = reduction == "none" ? "none" : "sum";
  Tensor local = F::cross_entropy(x, t, local_options);
  if (reduction == "none") return result(input, local, {input.size(0)}, to);
  if (reduction == "mean") {
    // nothing counted: NaN with a gradient of 0, as the whole op (count is the same on every rank)
    local = count.item<double>() == 0 ? local * 0.0 + std::numeric_limits<double>::quiet_NaN()
                                      : strata::div(local, count);
  }
  return result(input, local, {}, to);
}

}  // namespace strata::dist
