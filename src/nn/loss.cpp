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
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "nn/reduction.h"

namespace strata::nn::functional {

namespace {

// The targets of a class-index loss, checked, with ignore_index and the class weights applied.
struct ClassTargets {
  Tensor index;  // int64 (N, 1, d...): the targets, ignored ones replaced by 0
  Tensor valid;  // (N, d...) of the input's dtype: 1, or 0 where ignored
  Tensor coef;   // (N, d...): valid * weight[target]
};

// input (N, C, d...), target (N, d...).
ClassTargets class_targets(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                           std::string_view op) {
  Shape want = input.shape();
  want.erase(want.begin() + 1);
  STRATA_CHECK(target.shape() == want, "[{}] target of shape {} does not match input {}: expected {}", op,
               target.shape(), input.shape(), want);
  STRATA_CHECK(target.device() == input.device(), "[{}] target is on {} but the input is on {}", op, target.device(),
               input.device());
  const int64_t c = input.size(1);
  if (weight.defined()) {
    STRATA_CHECK(weight.shape() == Shape{c} && is_floating(weight.dtype()),
                 "[{}] weight must be a floating tensor of shape ({}), got {} {}", op, c, weight.dtype(),
                 weight.shape());
    STRATA_CHECK(weight.device() == input.device(), "[{}] weight is on {} but the input is on {}", op,
                 weight.device(), input.device());
  }
  NoGradGuard no_grad;
  ClassTargets t;
  const Tensor target64 = target.to(kInt64);
  const Tensor ignored = target64 == ignore_index;
  const Tensor safe = where(ignored, 0, target64);
  if (safe.numel() > 0) {
    const int64_t lo = amin(safe).item<int64_t>(), hi = amax(safe).item<int64_t>();
    STRATA_CHECK(lo >= 0 && hi < c, "[{}] target class index {} is out of range for {} classes (ignore_index is {})",
                 op, lo < 0 ? lo : hi, c, ignore_index);
  }
  t.index = safe.unsqueeze(1);
  t.valid = logical_not(ignored).to(input.dtype());
  t.coef = weight.defined() ? index_select(weight.to(input.dtype()), 0, safe.reshape({-1})).view(safe.shape()) * t.valid
                            : t.valid;
  return t;
}

// (1, C, 1, ...): broadcasts a per-class vector over an (N, C, d...) input.
Tensor per_class(const Tensor& w, int64_t dims) {
  Shape s(static_cast<size_t>(dims), 1);
  s[1] = w.numel();
  return w.view(s);
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
    if (red == Reduction::Mean) denom = sum(t.coef);
    out = red == Reduction::None ? per : red == Reduction::Sum ? sum(per) : sum(per) / denom;
  }
  autograd::record("cross_entropy", {x}, {out}, {x}, [t, w, total_w, eps, c, red, denom](const autograd::Grads& g,
                                                                                         const autograd::Saved& s) {
    const Tensor& x = s[0];
    Tensor gn = red == Reduction::Mean ? g[0] / denom : g[0];  // per-sample gradient (broadcasts)
    const Tensor a = gn * t.coef * (1 - eps);                   // the target term
    const Tensor sm = eps > 0 ? gn * t.valid * (eps / static_cast<double>(c)) : Tensor();
    const Tensor q_total = (sm.defined() ? a + sm * total_w : a).unsqueeze(1);
    if (autograd::is_grad_enabled()) {  // create_graph: recorded, out of place
      Tensor grad = strata::softmax(x, 1) * q_total;
      grad = scatter_add(grad, 1, t.index, (-a).unsqueeze(1));
      if (sm.defined()) grad = grad - (w.defined() ? sm.unsqueeze(1) * w : sm.unsqueeze(1));
      return autograd::Grads{grad};
    }
    Tensor grad = strata::softmax(x, 1);
    grad.mul_(q_total);
    scatter_add_(grad, 1, t.index, (-a).unsqueeze(1));
    if (sm.defined()) grad.sub_(w.defined() ? sm.unsqueeze(1) * w : sm.unsqueeze(1));
    return autograd::Grads{grad};
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

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& o) {
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
    out = cross_entropy_probs(x, unbatched ? target.unsqueeze(0) : target, o.weight, o.label_smoothing, red);
  } else {
    STRATA_CHECK(!unbatched || target.dim() == 0,
                 "[cross_entropy] an unbatched input of shape {} takes a 0-d class-index target, got shape {}",
                 input.shape(), target.shape());
    ClassTargets t = class_targets(x, unbatched ? target.unsqueeze(0) : target, o.weight, o.ignore_index,
                                   "cross_entropy");
    out = cross_entropy_indices(x, t, o.weight, o.label_smoothing, red);
  }
  return unbatched && red == Reduction::None ? out.squeeze(0) : out;
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& o) {
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
  Tensor out = red == Reduction::Mean ? sum(per) / sum(t.coef) : reduce_loss(per, red);
  return unbatched && red == Reduction::None ? out.squeeze(0) : out;
}

}  // namespace strata::nn::functional
