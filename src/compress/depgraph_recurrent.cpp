// Recurrent layers (nn::RNN, LSTM, GRU) in the dependency graph: how a call's channels are
// followed, their units' scores and how they are cut out.
//
// Note [Recurrent units]: one hidden_size serves every layer and direction, so hidden unit i is
// one unit in all of them: its row in each gate block of every weight_ih, weight_hh and bias,
// its column of weight_hh (of weight_hr with proj_size), its columns of the next layer's
// weight_ih (one per direction) and its features of the output (one per direction), which the
// consumer reads. The input features are weight_ih_l0's columns, in both directions. With
// proj_size the output holds projected features, which are kept (the hidden units still go).
#include <fmt/format.h>

#include <strata/core/error.hpp>
#include <strata/nn/recurrent.hpp>
#include <strata/ops/creation.hpp>

#include "compress/depgraph_internal.h"
#include "compress/prune_internal.h"

namespace strata::compress::detail {

namespace {

int64_t gates_of(const nn::RNNBase& r) { return r.all_weights[0].weight_ih.size(0) / r.hidden_size; }

// The indices `kept` within each of `count` blocks of `width`: the rows of every gate block, or
// the features of every direction, that kept hidden units hold.
Tensor in_blocks(int64_t count, int64_t width, const std::vector<int64_t>& kept) {
  std::vector<int64_t> index;
  for (int64_t b = 0; b < count; ++b)
    for (int64_t i : kept) index.push_back(b * width + i);
  return from_vector(index);
}

std::vector<int64_t> kept_of(int64_t n, const std::set<int64_t>& removed) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i)
    if (!removed.count(i)) kept.push_back(i);
  return kept;
}

}  // namespace

Channels follow_recurrent(Labels& labels, nn::RNNBase& r, const std::vector<Channels>& inputs,
                          const std::vector<Shape>& shapes, const Shape& out) {
  auto refuse = [&](const std::string& why) {
    for (const Channels& c : inputs)
      if (c.followed()) labels.mark(c.labels, why);
    return Channels{-1, {}, "the output of " + why};
  };
  if (r.form() != nullptr) return refuse(fmt::format("an {} whose weights a form replaced", r.name()));
  if (out.empty() || out.back() != r.num_directions * r.state_size)
    return refuse(fmt::format("an {} whose output does not have its features last", r.name()));
  const auto last = static_cast<int64_t>(shapes[0].size()) - 1;
  labels.unite(labels_at(labels, inputs[0], last, r.input_size, "an " + r.name()),
               labels.layer(&r, ChannelRole::In, r.input_size));
  for (size_t i = 1; i < inputs.size(); ++i)  // states given: of a size the forward fixed
    if (inputs[i].followed()) labels.mark(inputs[i].labels, fmt::format("an {}'s initial state", r.name()));
  const std::vector<int64_t>& hidden = labels.layer(&r, ChannelRole::Out, r.hidden_size);
  const auto features = static_cast<int64_t>(out.size()) - 1;
  if (r.options.proj_size > 0)
    return Channels{features,
                    labels.fresh(out.back(), fmt::format("the projected features of an {} with proj_size", r.name())),
                    {}};
  Channels output{features, {}, {}};
  for (int64_t d = 0; d < r.num_directions; ++d)
    output.labels.insert(output.labels.end(), hidden.begin(), hidden.end());
  return output;
}

std::vector<double> recurrent_scores(const nn::RNNBase& r, ChannelRole role, Importance kind) {
  auto along = [&](const Tensor& w, int64_t dim) { return host_values(channel_importance(w, kind, dim)); };
  const bool in = role == ChannelRole::In;
  std::vector<double> scores(static_cast<size_t>(in ? r.input_size : r.hidden_size), 0.0);
  if (r.form() != nullptr) return scores;  // no float weights to score
  auto add = [&](const std::vector<double>& s) {  // s has blocks of scores.size(), summed
    for (size_t j = 0; j < s.size(); ++j) scores[j % scores.size()] += s[j];
  };
  for (size_t k = 0; k < r.all_weights.size(); ++k) {
    const nn::RecurrentWeights& w = r.all_weights[k];
    const bool first_layer = static_cast<int64_t>(k) < r.num_directions;
    if (in) {
      if (first_layer) add(along(w.weight_ih, 1));
      continue;
    }
    add(along(w.weight_ih, 0)), add(along(w.weight_hh, 0));
    add(w.weight_hr.defined() ? along(w.weight_hr, 1) : along(w.weight_hh, 1));
    if (!first_layer && !w.weight_hr.defined()) add(along(w.weight_ih, 1));
  }
  return scores;
}

void shrink_recurrent(nn::RNNBase& r, const std::map<ChannelRole, std::set<int64_t>>& roles) {
  const int64_t gates = gates_of(r), hidden = r.hidden_size;
  for (const auto& [role, removed] : roles) {
    STRATA_CHECK(role == ChannelRole::In || role == ChannelRole::Out,
                 "[DependencyGraph] internal: an {} has no channels of that role", r.name());
    if (role == ChannelRole::In) {
      const Tensor kept = from_vector(kept_of(r.input_size, removed));
      for (int64_t k = 0; k < r.num_directions; ++k)
        take_slices(r.all_weights[static_cast<size_t>(k)].weight_ih, 1, kept);
      r.input_size = kept.numel();
      continue;
    }
    const std::vector<int64_t> kept = kept_of(hidden, removed);
    const Tensor rows = in_blocks(gates, hidden, kept), columns = from_vector(kept);
    const Tensor next_inputs = in_blocks(r.num_directions, hidden, kept);
    for (size_t k = 0; k < r.all_weights.size(); ++k) {
      nn::RecurrentWeights& w = r.all_weights[k];
      for (const Tensor& t : {w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh}) take_slices(t, 0, rows);
      take_slices(w.weight_hr.defined() ? w.weight_hr : w.weight_hh, 1, columns);
      if (static_cast<int64_t>(k) >= r.num_directions && !w.weight_hr.defined())
        take_slices(w.weight_ih, 1, next_inputs);  // the previous layer's hidden units
    }
    r.hidden_size = static_cast<int64_t>(kept.size());
    if (r.options.proj_size == 0) r.state_size = r.hidden_size;
  }
}

}  // namespace strata::compress::detail
