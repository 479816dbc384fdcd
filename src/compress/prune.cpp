// Pruning methods and importance scores: see include/strata/compress/prune.hpp. Scores are
// ranked on the host in float64 with a stable sort, so equal scores prune the lower index
// first and the result never depends on the device or the thread count.
#include <cmath>
#include <limits>
#include <numeric>

#include <strata/compress/prune.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "compress/prune_internal.h"

namespace strata::compress {

Amount::Amount(double fraction) : is_fraction_(true), value_(fraction) {
  STRATA_CHECK(std::isfinite(fraction) && fraction >= 0 && fraction <= 1,
               "[prune] amount={} should either be a fraction in the range [0, 1] or a non-negative count", fraction);
}

Amount::Amount(int count) : Amount(static_cast<int64_t>(count)) {}

Amount::Amount(int64_t count) : is_fraction_(false), value_(static_cast<double>(count)) {
  STRATA_CHECK(count >= 0, "[prune] amount={} should either be a fraction in the range [0, 1] or a non-negative count",
               count);
}

int64_t Amount::of(int64_t candidates, std::string_view op) const {
  // Python's round, as torch.nn.utils.prune: halves go to the even neighbour (nearbyint in the
  // default rounding mode)
  if (is_fraction_) return static_cast<int64_t>(std::nearbyint(value_ * static_cast<double>(candidates)));
  const auto count = static_cast<int64_t>(value_);
  STRATA_CHECK(count <= candidates, "[{}] amount={} should be smaller than the number of parameters to prune={}", op,
               count, candidates);
  return count;
}

namespace {

int64_t checked_dim(const Tensor& t, int64_t dim, std::string_view op) {
  STRATA_CHECK(dim >= -t.dim() && dim < t.dim(), "[{}] dim {} does not exist in a tensor of shape {} ({} dims)", op,
               dim, t.shape(), t.dim());
  return dim < 0 ? dim + t.dim() : dim;
}

// Entries i with keep[i] set.
std::vector<int64_t> kept_indices(const std::vector<uint8_t>& keep) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) out.push_back(static_cast<int64_t>(i));
  return out;
}

// Unstructured pruning of one parameter by `scores` (its numel, C order), among the entries the
// current mask keeps (torch's PruningContainer applies a new method to those alone).
void prune_smallest(nn::Module& module, const std::string& name, const Tensor& param, const std::vector<double>& scores,
                    Amount amount, std::string_view op) {
  std::vector<uint8_t> keep = detail::kept_entries(module, name, param);
  const std::vector<int64_t> candidates = kept_indices(keep);
  const int64_t k = amount.of(static_cast<int64_t>(candidates.size()), op);
  for (int64_t i : detail::smallest(scores, candidates, k)) keep[static_cast<size_t>(i)] = 0;
  detail::set_mask(module, name, param, keep);
}

}  // namespace

Tensor channel_norms(const Tensor& t, double p, int64_t dim) {
  STRATA_CHECK(t.defined() && t.dim() >= 1, "[channel_norms] needs a tensor with at least one dim");
  STRATA_CHECK(!std::isnan(p) && (p >= 0 || p == -std::numeric_limits<double>::infinity()),
               "[channel_norms] the norm's order p={} must be >= 0 or +-infinity", p);
  const int64_t d = checked_dim(t, dim, "channel_norms");
  const Tensor x = t.detach().to(kCPU, kFloat64);
  if (t.dim() == 1) return norm(x.unsqueeze(1), p, {1});  // one element per slice
  std::vector<int64_t> others;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i != d) others.push_back(i);
  return norm(x, p, others);
}

Tensor channel_importance(const Tensor& weight, Importance kind, int64_t dim) {
  switch (kind) {
    case Importance::L1: return channel_norms(weight, 1, dim);
    case Importance::L2: return channel_norms(weight, 2, dim);
    case Importance::Taylor:
      STRATA_CHECK(weight.grad().defined(),
                   "[channel_importance] Taylor importance sums |w * dL/dw| and needs the weight's gradient: run "
                   "backward first");
      return channel_norms(weight.detach() * weight.grad(), 1, dim);
  }
  return Tensor();
}

void l1_unstructured(nn::Module& module, const std::string& name, Amount amount, const Tensor& importance_scores) {
  const Tensor param = detail::find_parameter(module, name, "l1_unstructured");
  if (importance_scores.defined()) detail::check_scores(importance_scores, param, "l1_unstructured");
  const std::vector<double> scores = detail::host_values(abs(importance_scores.defined() ? importance_scores : param));
  prune_smallest(module, name, param, scores, amount, "l1_unstructured");
}

void random_unstructured(nn::Module& module, const std::string& name, Amount amount, Generator* gen) {
  const Tensor param = detail::find_parameter(module, name, "random_unstructured");
  const std::vector<double> scores = detail::host_values(rand(param.shape(), TensorOptions(kFloat64), gen));
  prune_smallest(module, name, param, scores, amount, "random_unstructured");
}

void ln_structured(nn::Module& module, const std::string& name, Amount amount, double n, int64_t dim,
                   const Tensor& importance_scores) {
  const Tensor param = detail::find_parameter(module, name, "ln_structured");
  STRATA_CHECK(param.dim() > 1,
               "[ln_structured] structured pruning needs a parameter with at least 2 dims; \"{}\" of {} has shape {}",
               name, module.name(), param.shape());
  const int64_t d = checked_dim(param, dim, "ln_structured");
  if (importance_scores.defined()) detail::check_scores(importance_scores, param, "ln_structured");
  const std::vector<double> norms =
      detail::host_values(channel_norms(importance_scores.defined() ? importance_scores : param, n, d));

  // Channels with an entry still kept are the candidates; each entry's channel index along d
  std::vector<uint8_t> keep = detail::kept_entries(module, name, param);
  const int64_t channels = param.size(d);
  int64_t inner = 1;
  for (int64_t i = d + 1; i < param.dim(); ++i) inner *= param.size(i);
  auto channel_of = [&](size_t i) { return (static_cast<int64_t>(i) / inner) % channels; };
  std::vector<uint8_t> alive(static_cast<size_t>(channels), 0);
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) alive[static_cast<size_t>(channel_of(i))] = 1;
  const std::vector<int64_t> candidates = kept_indices(alive);
  const int64_t k = amount.of(static_cast<int64_t>(candidates.size()), "ln_structured");
  std::vector<uint8_t> drop(static_cast<size_t>(channels), 0);
  for (int64_t c : detail::smallest(norms, candidates, k)) drop[static_cast<size_t>(c)] = 1;
  for (size_t i = 0; i < keep.size(); ++i)
    if (drop[static_cast<size_t>(channel_of(i))]) keep[i] = 0;
  detail::set_mask(module, name, param, keep);
}

void global_unstructured(const std::vector<PruneTarget>& targets, Amount amount,
                         const std::vector<Tensor>& importance_scores) {
  STRATA_CHECK(!targets.empty(), "[global_unstructured] no parameters to prune");
  STRATA_CHECK(importance_scores.empty() || importance_scores.size() == targets.size(),
               "[global_unstructured] {} importance score tensors for {} parameters", importance_scores.size(),
               targets.size());
  std::vector<Tensor> params;
  std::vector<double> scores;
  std::vector<uint8_t> keep;
  for (size_t t = 0; t < targets.size(); ++t) {
    STRATA_CHECK(targets[t].module != nullptr, "[global_unstructured] target {} has no module", t);
    for (size_t u = 0; u < t; ++u)
      STRATA_CHECK(targets[u].module != targets[t].module || targets[u].name != targets[t].name,
                   "[global_unstructured] \"{}\" of {} is listed twice", targets[t].name, targets[t].module->name());
    nn::Module& m = *targets[t].module;
    params.push_back(detail::find_parameter(m, targets[t].name, "global_unstructured"));
    const Tensor& s = importance_scores.empty() ? params.back() : importance_scores[t];
    if (!importance_scores.empty()) detail::check_scores(s, params.back(), "global_unstructured");
    const std::vector<double> v = detail::host_values(abs(s));
    const std::vector<uint8_t> k = detail::kept_entries(m, targets[t].name, params.back());
    scores.insert(scores.end(), v.begin(), v.end());
    keep.insert(keep.end(), k.begin(), k.end());
  }
  const std::vector<int64_t> candidates = kept_indices(keep);
  const int64_t k = amount.of(static_cast<int64_t>(candidates.size()), "global_unstructured");
  for (int64_t i : detail::smallest(scores, candidates, k)) keep[static_cast<size_t>(i)] = 0;
  size_t offset = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto n = static_cast<size_t>(params[t].numel());
    const std::vector<uint8_t> part(keep.begin() + static_cast<std::ptrdiff_t>(offset),
                                    keep.begin() + static_cast<std::ptrdiff_t>(offset + n));
    detail::set_mask(*targets[t].module, targets[t].name, params[t], part);
    offset += n;
  }
}

}  // namespace strata::compress
