// Physical structured pruning: see include/strata/compress/shrink.hpp. Every tensor keeps its
// handle and takes the selected slices (index_select), so a module's members, its registered
// parameters and anything else sharing the handle see the smaller value.
#include <strata/compress/shrink.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/linear.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>

#include "compress/prune_internal.h"

namespace strata::compress {

namespace {

nn::Conv2d* as_conv(nn::Module* m) { return dynamic_cast<nn::Conv2d*>(m); }
nn::Linear* as_linear(nn::Module* m) { return dynamic_cast<nn::Linear*>(m); }

// A supported layer's weight, or an error naming the role and the layer.
Tensor layer_weight(nn::Module* m, const char* role) {
  STRATA_CHECK(m != nullptr, "[shrink] the {} is null", role);
  if (nn::Conv2d* c = as_conv(m)) {
    STRATA_CHECK(c->options.groups == 1, "[shrink] the {} is a grouped Conv2d (groups={}); only groups=1 is supported",
                 role, c->options.groups);
    return c->weight;
  }
  if (nn::Linear* l = as_linear(m)) return l->weight;
  strata::detail::throw_error("[shrink] the {} must be an nn::Conv2d or nn::Linear, got {}", role, m->name());
}

// A mask of `weight`'s shape that keeps the slices `keep` along dim 0.
Tensor rows_mask(const Tensor& weight, const std::vector<int64_t>& keep) {
  const int64_t inner = weight.numel() / weight.size(0);
  std::vector<uint8_t> m(static_cast<size_t>(weight.numel()), 0);
  for (int64_t c : keep) std::fill_n(m.begin() + c * inner, inner, 1);
  return from_vector(m, weight.shape());
}

std::vector<int64_t> checked_keep(const ChannelGroup& group, std::vector<int64_t> keep) {
  check_group(group);
  const int64_t channels = num_channels(group);
  STRATA_CHECK(!keep.empty(), "[shrink] every channel of {} would be removed: keep at least one",
               group.producer->name());
  std::sort(keep.begin(), keep.end());
  for (size_t i = 0; i < keep.size(); ++i) {
    STRATA_CHECK(keep[i] >= 0 && keep[i] < channels, "[shrink] channel {} is out of range for {} with {} channels",
                 keep[i], group.producer->name(), channels);
    STRATA_CHECK(i == 0 || keep[i] != keep[i - 1], "[shrink] channel {} is listed twice", keep[i]);
  }
  return keep;
}

}  // namespace

int64_t num_channels(const ChannelGroup& group) { return layer_weight(group.producer, "producer").size(0); }

void check_group(const ChannelGroup& group) {
  const int64_t channels = num_channels(group);
  const bool conv_producer = as_conv(group.producer) != nullptr;
  std::vector<nn::Module*> layers{group.producer};
  if (group.norm != nullptr) {
    STRATA_CHECK(group.norm->num_features == channels,
                 "[shrink] mismatched layers: the producer {} has {} output channels but the norm {} has {} features",
                 group.producer->name(), channels, group.norm->name(), group.norm->num_features);
    layers.push_back(group.norm);
  }
  STRATA_CHECK(!group.consumers.empty(), "[shrink] the group of {} has no consumers: shrinking a network's output "
               "layer would change what it computes", group.producer->name());
  for (size_t i = 0; i < group.consumers.size(); ++i) {
    nn::Module* m = group.consumers[i];
    const Tensor w = layer_weight(m, "consumer");
    STRATA_CHECK(m != group.producer, "[shrink] the producer cannot also be its own consumer");
    // a consumer listed twice would have its input channels taken twice, the second time from
    // the already smaller weight
    for (size_t j = 0; j < i; ++j)
      STRATA_CHECK(group.consumers[j] != m, "[shrink] consumer {} ({}) is listed twice in the group of {}", i,
                   m->name(), group.producer->name());
    const int64_t in = w.size(1);
    // a Linear after a Conv2d reads the channels pooled (in == channels) or flattened (a multiple)
    const bool fits =
        as_conv(m) ? conv_producer && in == channels : in % channels == 0 && (conv_producer || in == channels);
    STRATA_CHECK(fits, "[shrink] mismatched consecutive layers: the producer {} has {} output channels but consumer {} "
                 "({}) takes {} input features", group.producer->name(), channels, i, m->name(), in);
    layers.push_back(m);
  }
  for (nn::Module* m : layers)
    STRATA_CHECK(!is_pruned(*m), "[shrink] {} has a pruning mask: call compress::remove on it first", m->name());
}

std::vector<std::vector<int64_t>> select_channels(const std::vector<ChannelGroup>& groups, Amount amount,
                                                  const ChannelSelection& selection) {
  STRATA_CHECK(!groups.empty(), "[select_channels] no channel groups");
  STRATA_CHECK(selection.min_channels >= 1, "[select_channels] min_channels must be >= 1, got {}",
               selection.min_channels);
  STRATA_CHECK(selection.scores.empty() || selection.scores.size() == groups.size(),
               "[select_channels] {} score tensors for {} groups", selection.scores.size(), groups.size());
  std::set<nn::Module*> producers, norms, consumers;
  std::vector<std::vector<double>> scores;  // per group, per channel
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group(groups[g]);
    STRATA_CHECK(producers.insert(groups[g].producer).second, "[select_channels] {} is the producer of two groups",
                 groups[g].producer->name());
    // prune_channels shrinks the groups one after another: a norm or consumer in two groups
    // would be cut twice (or fail halfway, with the earlier groups already shrunk)
    STRATA_CHECK(groups[g].norm == nullptr || norms.insert(groups[g].norm).second,
                 "[select_channels] {} is the norm of two groups", groups[g].norm->name());
    for (nn::Module* m : groups[g].consumers)
      STRATA_CHECK(consumers.insert(m).second, "[select_channels] {} is a consumer in two groups", m->name());
    const int64_t channels = num_channels(groups[g]);
    const Tensor s = selection.scores.empty() ? channel_importance(layer_weight(groups[g].producer, "producer"),
                                                                   selection.importance)
                                              : selection.scores[g];
    STRATA_CHECK(s.defined() && s.numel() == channels, "[select_channels] group {} has {} channels but {} "
                 "scores", g, channels, s.defined() ? s.numel() : 0);
    scores.push_back(detail::host_values(s));
  }
  int64_t total = 0;
  for (const auto& v : scores) total += static_cast<int64_t>(v.size());
  return detail::keep_after_removing(scores, amount.of(total, "select_channels"),
                                     std::vector<int64_t>(groups.size(), selection.min_channels), "select_channels");
}

namespace detail {

std::vector<std::vector<int64_t>> keep_after_removing(const std::vector<std::vector<double>>& scores, int64_t k,
                                                      const std::vector<int64_t>& min_left, std::string_view op) {
  std::vector<std::tuple<double, size_t, int64_t>> ranked;  // (score, list, entry)
  std::vector<int64_t> left;                                // entries each list still has
  for (size_t g = 0; g < scores.size(); ++g) {
    for (size_t c = 0; c < scores[g].size(); ++c) ranked.emplace_back(scores[g][c], g, static_cast<int64_t>(c));
    left.push_back(static_cast<int64_t>(scores[g].size()));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return score_less(std::get<0>(a), std::get<0>(b)); });
  std::vector<std::vector<uint8_t>> removed(scores.size());
  for (size_t g = 0; g < scores.size(); ++g) removed[g].assign(scores[g].size(), 0);
  int64_t done = 0;
  for (const auto& [score, g, c] : ranked) {
    if (done == k) break;
    if (left[g] <= min_left[g]) continue;
    removed[g][static_cast<size_t>(c)] = 1;
    --left[g];
    ++done;
  }
  STRATA_CHECK(done == k, "[{}] the amount asks for {} channels but only {} can go while the groups keep {}", op, k,
               done, fmt::join(min_left, ", "));
  std::vector<std::vector<int64_t>> keep(scores.size());
  for (size_t g = 0; g < scores.size(); ++g)
    for (size_t c = 0; c < removed[g].size(); ++c)
      if (!removed[g][c]) keep[g].push_back(static_cast<int64_t>(c));
  return keep;
}

}  // namespace detail

void mask_channels(const ChannelGroup& group, const std::vector<int64_t>& keep) {
  const std::vector<int64_t> kept = checked_keep(group, keep);
  auto mask_rows = [&](nn::Module& m, const Tensor& t, const char* name) {
    if (t.defined()) custom_from_mask(m, name, rows_mask(t, kept));
  };
  const Tensor weight = layer_weight(group.producer, "producer");
  mask_rows(*group.producer, weight, "weight");
  mask_rows(*group.producer, as_conv(group.producer) ? as_conv(group.producer)->bias : as_linear(group.producer)->bias,
            "bias");
  if (group.norm != nullptr) {
    mask_rows(*group.norm, group.norm->weight, "weight");
    mask_rows(*group.norm, group.norm->bias, "bias");
  }
}

void shrink_channels(const ChannelGroup& group, const std::vector<int64_t>& keep) {
  const std::vector<int64_t> kept = checked_keep(group, keep);
  const int64_t channels = num_channels(group), n = static_cast<int64_t>(kept.size());
  const Tensor index = from_vector(kept);
  if (nn::Conv2d* c = as_conv(group.producer)) {
    detail::take_slices(c->weight, 0, index);
    detail::take_slices(c->bias, 0, index);
    c->out_channels = n;
  } else {
    nn::Linear* l = as_linear(group.producer);
    detail::take_slices(l->weight, 0, index);
    detail::take_slices(l->bias, 0, index);
    l->out_features = n;
  }
  if (nn::BatchNormBase* bn = group.norm) {
    for (const Tensor& t : {bn->weight, bn->bias, bn->running_mean, bn->running_var}) detail::take_slices(t, 0, index);
    bn->num_features = n;
  }
  for (nn::Module* m : group.consumers) {
    if (nn::Conv2d* c = as_conv(m)) {
      detail::take_slices(c->weight, 1, index);
      c->in_channels = n;
      continue;
    }
    // a Linear after a flatten reads `positions` features per channel, channel-major (NCHW)
    nn::Linear* l = as_linear(m);
    const int64_t positions = l->in_features / channels;
    std::vector<int64_t> columns;
    for (int64_t ch : kept)
      for (int64_t p = 0; p < positions; ++p) columns.push_back(ch * positions + p);
    detail::take_slices(l->weight, 1, from_vector(columns));
    l->in_features = n * positions;
  }
}

std::vector<std::vector<int64_t>> prune_channels(const std::vector<ChannelGroup>& groups, Amount amount,
                                                 const ChannelSelection& selection) {
  std::vector<std::vector<int64_t>> keep = select_channels(groups, amount, selection);
  for (size_t g = 0; g < groups.size(); ++g) shrink_channels(groups[g], keep[g]);
  return keep;
}

}  // namespace strata::compress
