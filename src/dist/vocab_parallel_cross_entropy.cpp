// vocab_parallel_cross_entropy (Megatron-LM's): the cross entropy of logits split along the
// vocabulary, from three per-row quantities summed over the ranks instead of the whole logits.
//
// Note [Vocabulary-parallel cross entropy]. For row n with logits x_nj over the whole vocabulary
// V, target t, m_n = max_j x_nj (an allreduce of the shards' maxima) and z_nj = x_nj - m_n:
//   S_n = sum_j exp z_nj,   z_nt (from the rank holding t),   Z_n = sum_j z_nj (label smoothing),
// each a sum over the shards, in one allreduce. With lse_n = log S_n (of the shifted logits),
//   l_n = (1 - eps) (lse_n - z_nt) + eps (lse_n - Z_n / V),
// nn's cross entropy with label smoothing eps (0 for an ignored target). The gradient of l_n is
//   g_n (softmax_nj - (1 - eps) [j = t] - eps / V),
// local to each shard once the whole row's logsumexp m_n + lse_n is known (saved).
#include <strata/dist/vocab_parallel.hpp>

#include <bit>
#include <limits>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/function.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "dist/vocab_parallel.h"
#include "nn/reduction.h"

namespace strata::dist {

namespace {

using autograd::AutogradContext;
using Group = std::shared_ptr<ProcessGroup>;
using nn::Reduction;

struct Setup {
  Group group;
  int64_t start = 0, vocab = 0;  // this rank's first class and the whole vocabulary
  int64_t ignore_index = -100;
  double eps = 0;
  Reduction reduction = Reduction::Mean;
};

// What the backward needs besides the logits.
struct Saved {
  Tensor target;  // (N) int64: this rank's column of the target, 0 where the target is elsewhere or ignored
  Tensor here;    // (N) the logits' dtype: 1 where this rank holds the (not ignored) target
  Tensor valid;   // (N) the logits' dtype: 1 where the target is not ignored
  Tensor lse;     // (N) logsumexp of the whole row
  Tensor divisor; // "mean": the number of targets not ignored (1 when none)
};

Tensor summed(Tensor t, const Group& g, ReduceOp op) {
  t = t.contiguous();
  g->allreduce(t, op)->wait();
  return t;
}

struct VocabParallelCE : autograd::Function<VocabParallelCE> {
  // x (N, V_r), target (N) int64, both checked; returns the loss reduced as asked.
  static Tensor forward(AutogradContext& ctx, const Tensor& x, const Tensor& target, const Setup& s) {
    const int64_t width = x.size(1);
    const Tensor m = summed(amax(x, {1}), s.group, ReduceOp::Max);  // (N)
    const Tensor z = x - m.unsqueeze(1);                               // (N, V_r), <= 0
    const Tensor valid_b = target != s.ignore_index;
    const Tensor here_b = logical_and(valid_b, logical_and(target >= s.start, target < s.start + width));
    const Tensor column = where(here_b, target - s.start, 0);
    const Tensor picked = where(here_b, gather(z, 1, column.unsqueeze(1)).squeeze(1), 0.0);
    std::vector<Tensor> parts{sum(exp(z), {1}), picked};
    if (s.eps > 0) parts.push_back(sum(z, {1}));
    const Tensor sums = summed(stack(parts), s.group, ReduceOp::Sum);  // (2 or 3, N)
    const Tensor lse = log(sums.select(0, 0));
    Tensor per = (lse - sums.select(0, 1)) * (1 - s.eps);
    if (s.eps > 0) per = per + (lse - sums.select(0, 2) / static_cast<double>(s.vocab)) * s.eps;
    const Tensor valid = valid_b.to(x.dtype());
    per = where(valid_b, per, 0.0);

    Saved saved{column, here_b.to(x.dtype()), valid, m + lse, Tensor()};
    Tensor out;
    if (s.reduction == Reduction::Mean) {  // NaN when every target is ignored, with a gradient of 0
      const Tensor count = sum(valid);
      const Tensor none = count == 0;
      saved.divisor = where(none, 1.0, count);
      out = where(none, std::numeric_limits<double>::quiet_NaN(), sum(per) / saved.divisor);
    } else {
      out = s.reduction == Reduction::Sum ? sum(per) : per;
    }
    ctx.save_for_backward({x});
    ctx.saved_data["saved"] = saved;
    ctx.saved_data["setup"] = s;
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor x = ctx.saved()[0];
    const auto& sv = std::any_cast<const Saved&>(ctx.saved_data.at("saved"));
    const auto& s = std::any_cast<const Setup&>(ctx.saved_data.at("setup"));
    const Tensor g = s.reduction == Reduction::Mean ? grad[0] / sv.divisor : grad[0];  // 0-d or (N)
    const Tensor coef = g * sv.valid;                                                   // (N)
    Tensor gx = exp(x - sv.lse.unsqueeze(1)) * coef.unsqueeze(1);                       // softmax, scaled
    scatter_add_(gx, 1, sv.target.unsqueeze(1), (coef * sv.here * -(1 - s.eps)).unsqueeze(1));
    if (s.eps > 0) gx.sub_(coef.unsqueeze(1) * (s.eps / static_cast<double>(s.vocab)));
    return {gx, Tensor()};
  }
};

// The checks one rank can make alone; the shapes are compared across ranks afterwards.
void check_local(const Tensor& logits, const Tensor& target, const VocabParallelCrossEntropyOptions& o,
                 const char* op) {
  STRATA_CHECK(logits.defined() && target.defined(), "[{}] logits or target is undefined", op);
  STRATA_CHECK(is_floating(logits.dtype()), "[{}] logits must be floating, got {}", op, logits.dtype());
  STRATA_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32,
               "[{}] target must hold class indices (int64 or int32), got {}", op, target.dtype());
  STRATA_CHECK(logits.dim() >= 1 && logits.size(-1) >= 1,
               "[{}] logits of shape {} need a last (vocabulary) dim of at least 1", op, logits.shape());
  Shape want = logits.shape();
  want.pop_back();
  STRATA_CHECK(target.shape() == want, "[{}] target of shape {} does not match logits {}: expected {}", op,
               target.shape(), logits.shape(), want);
  STRATA_CHECK(target.device() == logits.device(), "[{}] target is on {} but the logits are on {}", op,
               target.device(), logits.device());
  STRATA_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "[{}] label_smoothing must be in [0, 1], got {}",
               op, o.label_smoothing);
  nn::parse_reduction(o.reduction, op);
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, Group group,
                                   const VocabParallelCrossEntropyOptions& o) {
  // autocast runs it in float32, as nn's cross entropy (the same policy)
  amp::detail::AutocastScope amp_scope("cross_entropy", logits, target);
  if (amp_scope.cast()) return vocab_parallel_cross_entropy(amp_scope[0], amp_scope[1], std::move(group), o);
  const char* op = "vocab_parallel_cross_entropy";
  Setup s{group ? std::move(group) : default_group()};
  std::exception_ptr error;
  detail::IndexStats stats;
  try {
    check_local(logits, target, o, op);
    s.reduction = nn::parse_reduction(o.reduction, op);
    stats = detail::index_stats(target, o.ignore_index);
  } catch (...) {
    error = std::current_exception();
  }
  // the widths differ by rank; everything else must agree, so that every rank raises alike below
  // (the options first: the targets' range depends on ignore_index)
  std::vector<detail::RankField> fields{{"ignore_index", o.ignore_index},
                                        {"reduction", static_cast<int64_t>(s.reduction)},
                                        {"label_smoothing (its bits)", std::bit_cast<int64_t>(o.label_smoothing)},
                                        {"logits dtype", error ? 0 : static_cast<int64_t>(logits.dtype())}};
  for (detail::RankField& f : detail::shape_fields(target, "target")) fields.push_back(std::move(f));
  const size_t width_field = fields.size();
  const int64_t width = error ? 0 : logits.size(-1);
  fields.insert(fields.end(), {{"vocabulary width", width, false},
                               {"sum of the targets", stats.sum},
                               {"smallest target", stats.lo},
                               {"largest target", stats.hi}});
  const Device device = logits.defined() ? logits.device() : Device::cpu();
  const auto all = detail::agree_across_ranks(*s.group, op, error, fields, device);
  for (int r = 0; r < s.group->size(); ++r) {
    if (r < s.group->rank()) s.start += all[r][width_field];
    s.vocab += all[r][width_field];
  }
  s.ignore_index = o.ignore_index;
  s.eps = o.label_smoothing;
  STRATA_CHECK(stats.lo >= 0 && stats.hi < s.vocab,
               "[{}] target class index {} is out of range for {} classes (ignore_index is {})", op,
               stats.lo < 0 ? stats.lo : stats.hi, s.vocab, o.ignore_index);

  const Tensor x = logits.reshape({-1, width});  // (N, V_r)
  const Tensor t = target.reshape({-1}).to(kInt64);
  const Tensor out = VocabParallelCE::apply(x, t, s);
  return s.reduction == Reduction::None ? out.view(target.shape()) : out;
}

}  // namespace strata::dist
