// cross_entropy and nll_loss over (N, C) and (N, C, d1, ...) inputs.
//
// Note [Cross entropy in one node]: with class indices, the loss of sample n is
//   l_n = sum_j q_nj (lse_n - x_nj),  q_nj = valid_n ((1 - eps) w_t delta_jt + eps / C w_j),
// lse_n = logsumexp_j x_nj, so the forward reads the logits once (logsumexp, a gather of x_nt,
// and for label smoothing one weighted sum) and never writes a log_softmax. The backward is
//   dl/dx_nj = g_n (softmax_nj Q_n - q_nj),  Q_n = sum_j q_nj,
// one softmax recomputed from the saved logits, scaled in place, with the target term
// scattered in: two passes over (N, C) where log_softmax + nll_loss take about five. The
// logits are saved instead of a log_softmax of the same size. With create_graph the same
// formula is recorded with out-of-place ops, so it can be differentiated again.
//
// Note [Fused cross entropy]: the common case, 2-D logits (N, C) with class indices, runs the
// cross_entropy_fused kernels (kernels/cpu/cross_entropy.h, kernels/cuda/cross_entropy.cu):
// one pass over each row gives its loss and logsumexp (saved for the backward), one pass
// writes the gradient; the reduction is applied here. Probability targets and spatial inputs
// (N, C, d...) take the composed path, which is also the create_graph backward of the fused
// one and what its test compares it with.
#include <limits>
#include <tuple>
#include <utility>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/cross_entropy.h"
#include "nn/reduction.h"
#include "ops/dispatch.h"

namespace strata::nn::functional {

namespace {

// The targets of a class-index loss, checked, with ignore_index and the class weights applied.
struct ClassTargets {
  Tensor index;  // int64 (N, 1, d...): the targets, ignored ones replaced by 0
  Tensor valid;  // (N, d...) of the input's dtype: 1, or 0 where ignored
  Tensor coef;   // (N, d...): valid * weight[target]
};

// Shape, device and weight checks of class-index targets: input (N, C, d...), target (N, d...).
void check_class_target(const Tensor& input, const Tensor& target, const Tensor& weight, std::string_view op) {
  Shape want = input.shape();
  want.erase(want.begin() + 1);
  STRATA_CHECK(target.shape() == want, "[{}] target of shape {} does not match input {}: expected {}", op,
               target.shape(), input.shape(), want);
  STRATA_CHECK(target.device() == input.device(), "[{}] target is on {} but the input is on {}", op, target.device(),
               input.device());
  const int64_t c = input.size(1);
  STRATA_CHECK(c > 0, "[{}] input of shape {} has no classes: dim 1 must not be empty", op, input.shape());
  if (weight.defined()) {
    STRATA_CHECK(weight.shape() == Shape{c} && is_floating(weight.dtype()),
                 "[{}] weight must be a floating tensor of shape ({}), got {} {}", op, c, weight.dtype(),
                 weight.shape());
    STRATA_CHECK(weight.device() == input.device(), "[{}] weight is on {} but the input is on {}", op,
                 weight.device(), input.device());
  }
}

// Raises unless every int64 target is ignore_index or a class in [0, c).
void check_target_range(const Tensor& target64, int64_t c, int64_t ignore_index, std::string_view op) {
  if (target64.numel() == 0) return;
  int64_t lo = 0, hi = 0;
  if (target64.device().is_cpu()) {  // a plain loop: no kernels, no temporaries
    const Tensor t = target64.contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (p[i] == ignore_index) continue;
      lo = std::min(lo, p[i]);
      hi = std::max(hi, p[i]);
    }
  } else {
    NoGradGuard no_grad;
    const Tensor safe = where(target64 == ignore_index, 0, target64);
    lo = amin(safe).item<int64_t>();
    hi = amax(safe).item<int64_t>();
  }
  STRATA_CHECK(lo >= 0 && hi < c, "[{}] target class index {} is out of range for {} classes (ignore_index is {})", op,
               lo < 0 ? lo : hi, c, ignore_index);
}

// The targets as the composed formulas use them, from checked int64 targets.
ClassTargets class_targets_of(const Tensor& input, const Tensor& target64, const Tensor& weight, int64_t ignore_index) {
  NoGradGuard no_grad;
  ClassTargets t;
  const Tensor ignored = target64 == ignore_index;
  const Tensor safe = where(ignored, 0, target64);
  t.index = safe.unsqueeze(1);
  t.valid = logical_not(ignored).to(input.dtype());
  t.coef = weight.defined() ? index_select(weight.to(input.dtype()), 0, safe.reshape({-1})).view(safe.shape()) * t.valid
                            : t.valid;
  return t;
}

// input (N, C, d...), target (N, d...).
ClassTargets class_targets(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                           std::string_view op) {
  check_class_target(input, target, weight, op);
  NoGradGuard no_grad;
  const Tensor target64 = target.to(kInt64);
  check_target_range(target64, input.size(1), ignore_index, op);
  return class_targets_of(input, target64, weight, ignore_index);
}

// (1, C, 1, ...): broadcasts a per-class vector over an (N, C, d...) input.
Tensor per_class(const Tensor& w, int64_t dims) {
  Shape s(static_cast<size_t>(dims), 1);
  s[1] = w.numel();
  return w.view(s);
}

// A weighted mean sum(per) / total and the divisor for its gradient: with no weight (every
// target ignored or weighted 0) the mean is NaN, as in PyTorch, and the divisor 1, so the
// gradient, whose per-sample weights are then all 0, is 0 rather than 0 * inf = NaN.
// Differentiable in per (nll_loss records through it).
std::pair<Tensor, Tensor> weighted_mean(const Tensor& per, const Tensor& total) {
  const Tensor no_weight = total == 0;
  const Tensor divisor = where(no_weight, 1, total);
  return {where(no_weight, std::numeric_limits<double>::quiet_NaN(), sum(per) / divisor), divisor};
}

// The gradient of Note [Cross entropy in one node] for x (N, C, d...) and the per-sample
// gradient gn (broadcasting over (N, d...)): recorded out of place with create_graph, else
// computed in place.
Tensor composed_grad(const Tensor& x, const ClassTargets& t, const Tensor& w, double total_w, double eps, int64_t c,
                     const Tensor& gn) {
  const Tensor a = gn * t.coef * (1 - eps);  // the target term
  const Tensor sm = eps > 0 ? gn * t.valid * (eps / static_cast<double>(c)) : Tensor();
  const Tensor q_total = (sm.defined() ? a + sm * total_w : a).unsqueeze(1);
  if (autograd::is_grad_enabled()) {
    Tensor grad = strata::softmax(x, 1) * q_total;
    grad = scatter_add(grad, 1, t.index, (-a).unsqueeze(1));
    if (sm.defined()) grad = grad - (w.defined() ? sm.unsqueeze(1) * w : sm.unsqueeze(1));
    return grad;
  }
  Tensor grad = strata::softmax(x, 1);
  grad.mul_(q_total);
  scatter_add_(grad, 1, t.index, (-a).unsqueeze(1));
  if (sm.defined()) grad.sub_(w.defined() ? sm.unsqueeze(1) * w : sm.unsqueeze(1));
  return grad;
}

Tensor cross_entropy_indices(const Tensor& x, const ClassTargets& t, const Tensor& weight, double eps, Reduction red) {
  const int64_t c = x.size(1);
  const Tensor w = weight.defined() ? per_class(weight.to(x.dtype()).detach(), x.dim()) : Tensor();
  const double total_w = weight.defined() ? sum(weight.to(kFloat64)).item<double>() : static_cast<double>(c);
  Tensor out, denom;
  {
    NoGradGuard no_grad;
    const Tensor lse = logsumexp(x, {1});                       // (N, d...)
    const Tensor picked = gather(x, 1, t.index).squeeze(1);     // x_nt
    Tensor per = (lse - picked) * t.coef * (1 - eps);
    if (eps > 0) {
      const Tensor wx = w.defined() ? sum(x * w, {1}) : sum(x, {1});  // sum_j w_j x_nj
      per = per + (lse * total_w - wx) * t.valid * (eps / static_cast<double>(c));
    }
    if (red == Reduction::Mean) std::tie(out, denom) = weighted_mean(per, sum(t.coef));
    else out = red == Reduction::None ? per : sum(per);
  }
  autograd::record("cross_entropy", {x}, {out}, {x}, [t, w, total_w, eps, c, red, denom](const autograd::Grads& g,
                                                                                         const autograd::Saved& s) {
    return autograd::Grads{composed_grad(s[0], t, w, total_w, eps, c, red == Reduction::Mean ? g[0] / denom : g[0])};
  });
  return out;
}

// Probability targets: -sum_j w_j y'_nj log_softmax(x)_nj, composed of differentiable ops
// (so the target gets a gradient too).
Tensor cross_entropy_probs(const Tensor& x, const Tensor& target, const Tensor& weight, double eps, Reduction red) {
  const int64_t c = x.size(1);
  Tensor y = target.to(x.dtype());
  if (eps > 0) y = y * (1 - eps) + eps / static_cast<double>(c);
  Tensor q = weight.defined() ? y * per_class(weight.to(x.dtype()).detach(), x.dim()) : y;
  Tensor per = sum(q * (logsumexp(x, {1}, true) - x), {1});  // (N, d...)
  if (red == Reduction::Mean) return sum(per) / static_cast<double>(per.numel());  // NaN when empty
  return reduce_loss(per, red);
}

// Note [Fused cross entropy]. x (N, C), C >= 1; target (N) class indices.
Tensor cross_entropy_fused(const Tensor& x, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                           double eps, Reduction red) {
  check_class_target(x, target, weight, "cross_entropy");
  const int64_t n = x.size(0), c = x.size(1);
  Tensor target64, wc, lse, out, denom;
  CrossEntropyParams p{ignore_index, eps, static_cast<double>(c)};
  {
    NoGradGuard no_grad;
    target64 = target.to(kInt64).contiguous();
    check_target_range(target64, c, ignore_index, "cross_entropy");
    if (weight.defined()) {
      wc = weight.to(x.dtype()).contiguous();
      if (eps > 0) p.total_weight = sum(weight.to(kFloat64)).item<double>();
    }
    const Tensor xc = x.contiguous();
    Tensor outs[2] = {detail::make_tensor({n}, x.dtype(), x.device()),
                      detail::make_tensor({n}, detail::compute_dtype(x.dtype()), x.device())};
    const Tensor ins[3] = {xc, target64, wc};
    if (n > 0) run_kernel(OpId::cross_entropy_fused, x.dtype(), KernelCall{ins, outs, &p});
    lse = outs[1];
    if (red == Reduction::Mean) {
      const Tensor valid = (target64 != ignore_index).to(x.dtype());
      const Tensor coef =
          wc.defined() ? index_select(wc, 0, where(target64 == ignore_index, 0, target64)) * valid : valid;
      std::tie(out, denom) = weighted_mean(outs[0], sum(coef));
    } else {
      out = red == Reduction::None ? outs[0] : sum(outs[0]);
    }
  }
  autograd::record("cross_entropy", {x}, {out}, {x, lse}, [target64, wc, denom, p, red, n, c](
                                                             const autograd::Grads& g, const autograd::Saved& s) {
    const Tensor& x = s[0];
    const Tensor gn = red == Reduction::Mean ? g[0] / denom : g[0];  // 0-d or (N)
    if (autograd::is_grad_enabled()) {  // create_graph: the composed formula, recorded
      const ClassTargets t = class_targets_of(x, target64, wc, p.ignore_index);
      const Tensor w = wc.defined() ? wc.view({1, c}) : Tensor();
      return autograd::Grads{composed_grad(x, t, w, p.total_weight, p.label_smoothing, c, gn)};
    }
    Tensor gx = detail::make_tensor({n, c}, x.dtype(), x.device());
    const Tensor ins[5] = {gn.to(x.dtype()), x.contiguous(), target64, s[1], wc};
    if (gx.numel() > 0) run_kernel(OpId::cross_entropy_fused_backward, x.dtype(), KernelCall{ins, {&gx, 1}, &p});
    return autograd::Grads{gx};
  });
  return out;
}

bool fused_applies(const Tensor& x) {
  const DeviceType dev = x.device().type;
  return x.dim() == 2 && x.size(1) > 0 && ext::has_kernel(OpId::cross_entropy_fused, dev, x.dtype()) &&
         ext::has_kernel(OpId::cross_entropy_fused_backward, dev, x.dtype());
}

// ---- CPU kernels of the fused cross entropy ------------------------------------------------

template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.data()) : nullptr; }

void check_fused_layout(const Tensor& x, const Tensor& target, const Tensor& w, std::string_view op) {
  STRATA_CHECK(x.dim() == 2 && x.is_contiguous() && target.dtype() == kInt64 && target.is_contiguous() &&
                   target.numel() == x.size(0) && (!w.defined() || (w.is_contiguous() && w.dtype() == x.dtype())),
               "[{}] kernel needs contiguous (N, C) logits, N int64 targets and C weights of the logits' dtype", op);
}

// inputs (x (N, C), target (N) int64, weight (C) or undefined); outputs (loss (N), lse (N)).
void cpu_cross_entropy_fused(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  check_fused_layout(x, call.inputs[1], call.inputs[2], "cross_entropy_fused");
  const auto& p = call.param<CrossEntropyParams>();
  dispatch<DTypeSet::Floating>(x.dtype(), "cross_entropy_fused", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::cross_entropy_forward<T>(static_cast<const T*>(x.data()), call.inputs[1].data_ptr<int64_t>(),
                                  ptr_or_null<T>(call.inputs[2]), static_cast<T*>(call.outputs[0].data()),
                                  static_cast<compute_t<T>*>(call.outputs[1].data()), x.size(0), x.size(1),
                                  p.ignore_index, p.label_smoothing, p.total_weight);
  });
}

// inputs (g 0-d or (N), x, target, lse, weight or undefined); outputs (gx (N, C)).
void cpu_cross_entropy_fused_backward(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& x = call.inputs[1];
  check_fused_layout(x, call.inputs[2], call.inputs[4], "cross_entropy_fused_backward");
  STRATA_CHECK(g.dtype() == x.dtype() && (g.dim() == 0 || (g.dim() == 1 && g.size(0) == x.size(0))),
               "[cross_entropy_fused_backward] the gradient must be 0-d or (N) of the logits' dtype, got {} {}",
               g.dtype(), g.shape());
  const auto& p = call.param<CrossEntropyParams>();
  dispatch<DTypeSet::Floating>(x.dtype(), "cross_entropy_fused_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::cross_entropy_backward<T>(static_cast<const T*>(g.data()), g.dim() == 0 ? 0 : g.stride(0),
                                   static_cast<const T*>(x.data()), call.inputs[2].data_ptr<int64_t>(),
                                   static_cast<const compute_t<T>*>(call.inputs[3].data()),
                                   ptr_or_null<T>(call.inputs[4]), static_cast<T*>(call.outputs[0].data()), x.size(0),
                                   x.size(1), p.ignore_index, p.label_smoothing, p.total_weight);
  });
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& o) {
  amp::detail::AutocastScope amp_scope("cross_entropy", input, target);
  if (amp_scope.cast()) return cross_entropy(amp_scope[0], amp_scope[1], o);
  STRATA_CHECK(input.defined() && target.defined(), "[cross_entropy] input or target is undefined");
  STRATA_CHECK(is_floating(input.dtype()), "[cross_entropy] input must be floating logits, got {}", input.dtype());
  STRATA_CHECK(input.dim() >= 1, "[cross_entropy] input must have a class dim, got a 0-d tensor");
  STRATA_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1,
               "[cross_entropy] label_smoothing must be in [0, 1], got {}", o.label_smoothing);
  const Reduction red = parse_reduction(o.reduction, "cross_entropy");
  const bool probs = is_floating(target.dtype());
  STRATA_CHECK(probs || target.dtype() == kInt64 || target.dtype() == kInt32,
               "[cross_entropy] target must hold class indices (int64 or int32) or class probabilities (floating), "
               "got {}", target.dtype());
  // unbatched (C): a batch of one
  const bool unbatched = input.dim() == 1;
  const Tensor x = unbatched ? input.unsqueeze(0) : input;
  Tensor out;
  if (probs) {
    STRATA_CHECK(target.shape() == input.shape(),
                 "[cross_entropy] class-probability target of shape {} must match the input's shape {}",
                 target.shape(), input.shape());
    STRATA_CHECK(!o.weight.defined() || o.weight.shape() == Shape{x.size(1)},
                 "[cross_entropy] weight must have shape ({}), got {}", x.size(1), o.weight.shape());
    STRATA_CHECK(o.ignore_index < 0, "[cross_entropy] ignore_index {} applies to class-index targets only, and the "
                 "target holds class probabilities ({})", o.ignore_index, target.dtype());
    out = cross_entropy_probs(x, unbatched ? target.unsqueeze(0) : target, o.weight, o.label_smoothing, red);
  } else {
    STRATA_CHECK(!unbatched || target.dim() == 0,
                 "[cross_entropy] an unbatched input of shape {} takes a 0-d class-index target, got shape {}",
                 input.shape(), target.shape());
    const Tensor t = unbatched ? target.unsqueeze(0) : target;
    if (fused_applies(x)) {
      out = cross_entropy_fused(x, t, o.weight, o.ignore_index, o.label_smoothing, red);
    } else {
      const ClassTargets ct = class_targets(x, t, o.weight, o.ignore_index, "cross_entropy");
      out = cross_entropy_indices(x, ct, o.weight, o.label_smoothing, red);
    }
  }
  return unbatched && red == Reduction::None ? out.squeeze(0) : out;
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& o) {
  amp::detail::AutocastScope amp_scope("nll_loss", input, target);
  if (amp_scope.cast()) return nll_loss(amp_scope[0], amp_scope[1], o);
  STRATA_CHECK(input.defined() && target.defined(), "[nll_loss] input or target is undefined");
  STRATA_CHECK(is_floating(input.dtype()), "[nll_loss] input must be floating log-probabilities, got {}",
               input.dtype());
  STRATA_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32,
               "[nll_loss] target must hold class indices (int64 or int32), got {}", target.dtype());
  STRATA_CHECK(input.dim() >= 1, "[nll_loss] input must have a class dim, got a 0-d tensor");
  const Reduction red = parse_reduction(o.reduction, "nll_loss");
  const bool unbatched = input.dim() == 1;
  STRATA_CHECK(!unbatched || target.dim() == 0,
               "[nll_loss] an unbatched input of shape {} takes a 0-d target, got shape {}", input.shape(),
               target.shape());
  const Tensor x = unbatched ? input.unsqueeze(0) : input;
  ClassTargets t = class_targets(x, unbatched ? target.unsqueeze(0) : target, o.weight, o.ignore_index, "nll_loss");
  const Tensor per = -(gather(x, 1, t.index).squeeze(1) * t.coef);
  Tensor out = red == Reduction::Mean ? weighted_mean(per, sum(t.coef)).first : reduce_loss(per, red);
  return unbatched && red == Reduction::None ? out.squeeze(0) : out;
}

}  // namespace strata::nn::functional

namespace strata::detail {
void register_cross_entropy_kernels(KernelTable& table) {
  table.set(OpId::cross_entropy_fused, DeviceType::CPU, kFloatDTypes, nn::functional::cpu_cross_entropy_fused);
  table.set(OpId::cross_entropy_fused_backward, DeviceType::CPU, kFloatDTypes,
            nn::functional::cpu_cross_entropy_fused_backward);
}
}  // namespace strata::detail
