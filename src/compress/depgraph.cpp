// DependencyGraph (include/strata/compress/depgraph.hpp): the trace, unit importance, selection
// and the rebuild of every member's layers. The walk is in depgraph_trace.cpp (the ops that move,
// split or contract the channel dim in depgraph_ops.cpp, the layers followed whole in
// depgraph_modules.cpp, recurrent layers in depgraph_recurrent.cpp), the labels and groups in
// depgraph_labels.cpp, what each kind of layer's pruning needs in depgraph_layers.cpp.
#include <strata/compress/depgraph.hpp>

#include <algorithm>
#include <functional>
#include <set>

#include <fmt/format.h>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/attention.hpp>

#include "compress/depgraph_internal.h"
#include "compress/prune_internal.h"

namespace strata::compress {

namespace {

// Puts every module in eval mode for the trace (batch norm statistics stay as they are) and
// gives each its own mode back, and takes the forward hooks off, however the trace ends.
class TraceScope {
 public:
  TraceScope(nn::Module& model, detail::TraceModules& modules) {
    for (auto& [name, m] : model.named_modules()) {
      modes_.emplace_back(m, m->is_training());
      hooks_.push_back(m->register_forward_hook(
          [&modules](nn::Module& mod, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
            if (outputs.empty() || !outputs[0].defined() || !outputs[0].grad_fn()) return;
            const Tensor& out = outputs[0];
            modules.by_node[out.grad_fn().get()].push_back(&mod);
            modules.results.push_back(out.grad_fn());
            if (detail::has_module_rule(&mod))
              (outputs.size() == 1 ? modules.calls : modules.calls_with_states)
                  .push_back({&mod, inputs, outputs.size() == 1 ? out.grad_fn() : nullptr});
          }));
      for (auto& [pname, p] : m->named_parameters(false))
        if (pname == "weight" && p.defined()) modules.by_weight.emplace(p.impl_ptr().get(), m);
    }
    model.eval();
  }
  ~TraceScope() {
    for (auto& h : hooks_) h.remove();
    for (auto& [m, training] : modes_) m->train(training);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  std::vector<std::pair<nn::Module*, bool>> modes_;
  std::vector<nn::RemovableHandle> hooks_;
};

std::unique_ptr<DependencyGraph::Traced> trace(nn::Module& model, const Tensor& example,
                                               const DependencyOptions& options) {
  STRATA_CHECK(example.defined(), "[DependencyGraph] the example input is undefined");
  detail::Labels labels;
  detail::TraceModules modules;
  {
    Tensor x = example.detach();
    if (is_floating(x.dtype())) x.requires_grad_(true);  // so the graph starts at the input
    EnableGradGuard grad;
    TraceScope scope(model, modules);
    const Tensor y = model(x);
    detail::follow_channels(labels, modules, x, y);
  }
  return detail::build_groups(labels, model, options);
}

// Whether a per-group ratio keyed by the member's layer applies to the member's group: the
// layer's outputs, or an attention layer's heads.
bool keyed_by(const GroupMember& m) {
  const bool attention = dynamic_cast<const nn::MultiheadAttention*>(m.module) != nullptr;
  return m.role == (attention ? ChannelRole::Head : ChannelRole::Out);
}

const char* role_word(ChannelRole role) {
  switch (role) {
    case ChannelRole::In: return "input";
    case ChannelRole::Out: return "output";
    case ChannelRole::Norm: return "normalized";
    case ChannelRole::Head: return "head's";
    case ChannelRole::Key: return "key";
    case ChannelRole::Value: return "value";
  }
  return "?";
}

// The entry of a layer whose every channel along its role the unit holds (removing the unit
// would leave the layer with none, as a branch read by one group of a grouped convolution), or null.
const detail::UnitEntry* emptied_layer(const std::vector<detail::UnitEntry>& unit) {
  std::map<std::pair<nn::Module*, ChannelRole>, int64_t> held;
  for (const detail::UnitEntry& e : unit) ++held[{e.module, e.role}];
  for (const detail::UnitEntry& e : unit)
    if (held[{e.module, e.role}] == detail::layer_channels(e.module, e.role)) return &e;
  return nullptr;
}

// What pruning changes in the traced layers (their tensors' values and gradients, their sizes),
// put back by restore() when the smaller model fails, so a failed prune changes nothing.
class LayerSnapshot {
 public:
  explicit LayerSnapshot(const DependencyGraph::Traced& traced) {
    std::set<nn::Module*> seen;
    for (const DependencyGroup& g : traced.groups)
      for (const GroupMember& m : g.members)
        if (seen.insert(m.module).second) save(*m.module);
  }
  void restore() const {
    NoGradGuard no_grad;
    for (const auto& [handle, value, grad] : tensors_) {
      handle.set_data(value);
      if (handle.requires_grad()) handle.set_grad(grad);
    }
    for (const auto& put_back : sizes_) put_back();
  }

 private:
  void save(nn::Module& m) {
    for (nn::Module* shrunk : detail::shrunk_modules(m))
      for (const auto& list : {shrunk->named_parameters(false), shrunk->named_buffers(false)})
        for (const auto& [name, t] : list)
          if (t.defined()) tensors_.push_back({t, t.detach(), t.requires_grad() ? t.grad() : Tensor()});
    sizes_.push_back(detail::saved_sizes(m));
  }
  struct Saved {
    Tensor handle, value, grad;
  };
  std::vector<Saved> tensors_;
  std::vector<std::function<void()>> sizes_;
};

// Removes from every member the units each group does not keep.
void remove_units(const DependencyGraph::Traced& traced, const std::vector<std::vector<int64_t>>& keep) {
  std::map<nn::Module*, std::map<ChannelRole, std::set<int64_t>>> removal;  // channels per layer and role
  for (size_t g = 0; g < keep.size(); ++g) {
    const std::set<int64_t> kept(keep[g].begin(), keep[g].end());
    for (size_t u = 0; u < traced.units[g].size(); ++u)
      if (!kept.count(static_cast<int64_t>(u)))
        for (const detail::UnitEntry& e : traced.units[g][u]) removal[e.module][e.role].insert(e.index);
  }
  for (const auto& [m, roles] : removal) detail::shrink_layer(m, roles);
}

}  // namespace

DependencyGraph::DependencyGraph(nn::Module& model, const Tensor& example_input, DependencyOptions options)
    : model_(&model), example_(example_input), options_(std::move(options)) {
  const auto named = model.named_modules();
  for (nn::Module* layer : options_.protected_layers)
    STRATA_CHECK(std::any_of(named.begin(), named.end(), [&](const auto& m) { return m.second == layer; }),
                 "[DependencyGraph] a protected layer ({}) is not a module of the model",
                 layer != nullptr ? layer->name() : "null");
  retrace();
}

DependencyGraph::~DependencyGraph() = default;
DependencyGraph::DependencyGraph(DependencyGraph&&) noexcept = default;
DependencyGraph& DependencyGraph::operator=(DependencyGraph&&) noexcept = default;

void DependencyGraph::retrace() { traced_ = trace(*model_, example_, options_); }

void DependencyGraph::remove_and_retrace(const std::vector<std::vector<int64_t>>& keep) {
  const LayerSnapshot before(*traced_);
  try {
    remove_units(*traced_, keep);
    retrace();
  } catch (const std::exception& e) {
    before.restore();
    strata::detail::throw_error(
        "[DependencyGraph] the pruned model failed on the example input, so nothing was pruned (a size fixed in "
        "its forward, a layer the trace did not see?): {}",
        e.what());
  }
}

const std::vector<DependencyGroup>& DependencyGraph::groups() const { return traced_->groups; }

std::string DependencyGraph::report() const {
  std::string out;
  for (size_t g = 0; g < groups().size(); ++g) out += fmt::format("group {}: {}\n", g, groups()[g].to_string());
  return out;
}

std::vector<double> DependencyGraph::importance(size_t g, Importance kind) const {
  STRATA_CHECK(g < groups().size(), "[DependencyGraph] group {} is out of range: there are {}", g, groups().size());
  std::map<std::pair<nn::Module*, ChannelRole>, std::vector<double>> scores;
  for (const GroupMember& m : groups()[g].members) scores[{m.module, m.role}] = detail::member_scores(m, kind);
  std::vector<double> units;
  for (const auto& entries : traced_->units[g]) {
    double sum = 0;
    for (const detail::UnitEntry& e : entries) sum += scores.at({e.module, e.role})[static_cast<size_t>(e.index)];
    units.push_back(sum);
  }
  return units;
}

std::vector<std::vector<int64_t>> DependencyGraph::select(Amount ratio, const GraphPruning& how) const {
  STRATA_CHECK(how.min_units >= 1, "[DependencyGraph] min_units must be >= 1, got {}", how.min_units);
  STRATA_CHECK(!how.global || how.ratios.empty(), "[DependencyGraph] per-group ratios need global = false");
  for (const auto& [layer, fraction] : how.ratios) {
    const bool found = std::any_of(groups().begin(), groups().end(), [&, layer = layer](const DependencyGroup& g) {
      return std::any_of(g.members.begin(), g.members.end(),
                         [&](const GroupMember& m) { return m.module == layer && keyed_by(m); });
    });
    STRATA_CHECK(found, "[DependencyGraph] a ratio is given for {}, whose outputs no traced group holds",
                 layer != nullptr ? layer->name() : "a null layer");
  }
  // per prunable group, its removable units (not those holding all of a layer's channels), their
  // scores, how many of them stay for the group to keep min_units, and how many can go
  std::vector<size_t> prunable;
  std::vector<std::vector<int64_t>> removable;
  std::vector<std::vector<double>> scores;
  std::vector<int64_t> stay, can_go;
  int64_t total = 0, total_can_go = 0;
  for (size_t g = 0; g < groups().size(); ++g) {
    if (!groups()[g].prunable()) continue;
    prunable.push_back(g);
    const std::vector<double> all = importance(g, how.importance);
    auto& units = removable.emplace_back();
    auto& s = scores.emplace_back();
    for (int64_t u = 0; u < groups()[g].size; ++u)
      if (emptied_layer(traced_->units[g][static_cast<size_t>(u)]) == nullptr)
        units.push_back(u), s.push_back(all[static_cast<size_t>(u)]);
    const auto whole = groups()[g].size - static_cast<int64_t>(units.size());
    stay.push_back(std::max<int64_t>(how.min_units - whole, 0));
    can_go.push_back(std::max<int64_t>(static_cast<int64_t>(units.size()) - stay.back(), 0));
    total += groups()[g].size, total_can_go += can_go.back();
  }
  std::vector<std::vector<int64_t>> keep(groups().size());
  for (size_t g = 0; g < groups().size(); ++g)
    for (int64_t u = 0; u < groups()[g].size; ++u) keep[g].push_back(u);
  auto remove = [&](size_t i, const std::vector<int64_t>& kept) {  // kept: indices into removable[i]
    std::set<int64_t> gone(removable[i].begin(), removable[i].end());
    for (int64_t j : kept) gone.erase(removable[i][static_cast<size_t>(j)]);
    std::erase_if(keep[prunable[i]], [&](int64_t u) { return gone.count(u) > 0; });
  };
  const std::string why =
      fmt::format("each group keeps {} units, and a unit holding all of a layer's channels stays", how.min_units);
  if (how.global) {
    const int64_t k = ratio.of(total, "DependencyGraph");
    STRATA_CHECK(k <= total_can_go, "[DependencyGraph] the amount asks for {} units but only {} can go ({})", k,
                 total_can_go, why);
    const auto kept = detail::keep_after_removing(scores, k, stay, "DependencyGraph");
    for (size_t i = 0; i < prunable.size(); ++i) remove(i, kept[i]);
    return keep;
  }
  for (size_t i = 0; i < prunable.size(); ++i) {
    const DependencyGroup& group = groups()[prunable[i]];
    Amount amount = ratio;
    for (const GroupMember& m : group.members)
      if (auto it = how.ratios.find(m.module); it != how.ratios.end() && keyed_by(m))
        amount = Amount(it->second);
    // a fraction of a small group removes what it can; a count must be met
    int64_t k = amount.of(group.size, "DependencyGraph");
    if (amount.is_fraction()) k = std::min(k, can_go[i]);
    STRATA_CHECK(k <= can_go[i], "[DependencyGraph] the amount asks for {} units of group {} but only {} can go ({})",
                 k, prunable[i], can_go[i], why);
    remove(i, detail::keep_after_removing({scores[i]}, k, {stay[i]}, "DependencyGraph")[0]);
  }
  return keep;
}

void DependencyGraph::prune_group(size_t g, const std::vector<int64_t>& keep) {
  STRATA_CHECK(g < groups().size(), "[DependencyGraph] group {} is out of range: there are {}", g, groups().size());
  const DependencyGroup& group = groups()[g];
  STRATA_CHECK(group.prunable(), "[DependencyGraph] group {} cannot be pruned: {}", g, group.unprunable_reason);
  STRATA_CHECK(!keep.empty(), "[DependencyGraph] every unit of group {} would be removed: keep at least one", g);
  std::set<int64_t> kept;
  for (int64_t u : keep) {
    STRATA_CHECK(u >= 0 && u < group.size, "[DependencyGraph] unit {} is out of range for group {} of {} units", u, g,
                 group.size);
    STRATA_CHECK(kept.insert(u).second, "[DependencyGraph] unit {} is listed twice", u);
  }
  std::vector<std::vector<int64_t>> all(groups().size());
  for (size_t other = 0; other < all.size(); ++other)
    for (int64_t u = 0; u < groups()[other].size; ++u) all[other].push_back(u);
  for (int64_t u = 0; u < group.size; ++u)
    if (const detail::UnitEntry* e = emptied_layer(traced_->units[g][static_cast<size_t>(u)]); e && !kept.count(u)) {
      const auto m = std::find_if(group.members.begin(), group.members.end(),
                                  [&](const GroupMember& member) { return member.module == e->module; });
      STRATA_CHECK(false, "[DependencyGraph] unit {} of group {} holds every {} channel of '{}': removing it would "
                   "leave the layer with none", u, g, role_word(e->role),
                   m != group.members.end() ? m->name : "?");
    }
  all[g].assign(kept.begin(), kept.end());
  remove_and_retrace(all);
}

std::vector<std::vector<int64_t>> DependencyGraph::prune(Amount ratio, const GraphPruning& how) {
  const std::vector<std::vector<int64_t>> keep = select(ratio, how);
  remove_and_retrace(keep);
  return keep;
}

}  // namespace strata::compress
