// The labels of a trace and the groups made from them (Note [Channel labels] in
// depgraph_internal.h).
#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include <strata/compress/prune.hpp>
#include <strata/core/error.hpp>

#include "compress/depgraph_internal.h"

namespace strata::compress::detail {

std::vector<int64_t> Labels::fresh(int64_t n, const std::string& reason) {
  std::vector<int64_t> made;
  for (int64_t i = 0; i < n; ++i) {
    made.push_back(size());
    parent_.push_back(size());
    entries_.emplace_back();
    reasons_.emplace_back();
    if (!reason.empty()) reasons_.back().push_back(reason);
  }
  return made;
}

const std::vector<int64_t>& Labels::layer(nn::Module* module, ChannelRole role, int64_t n) {
  auto [it, made] = layers_.try_emplace({module, role});
  if (made) {
    it->second = fresh(n);
    for (int64_t i = 0; i < n; ++i) entries_[static_cast<size_t>(it->second[i])].push_back({module, role, i});
  }
  return it->second;
}

int64_t Labels::find(int64_t label) {
  while (parent_[static_cast<size_t>(label)] != label) {
    auto& p = parent_[static_cast<size_t>(label)];
    p = parent_[static_cast<size_t>(p)];  // path halving
    label = p;
  }
  return label;
}

void Labels::unite(int64_t a, int64_t b) {
  a = find(a), b = find(b);
  if (a == b) return;
  if (a > b) std::swap(a, b);
  parent_[static_cast<size_t>(b)] = a;
}

void Labels::unite(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  STRATA_CHECK(a.size() == b.size(), "[DependencyGraph] internal: tying {} channels to {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) unite(a[i], b[i]);
}

void Labels::mark(int64_t label, const std::string& reason) { reasons_[static_cast<size_t>(label)].push_back(reason); }

void Labels::mark(const std::vector<int64_t>& labels, const std::string& reason) {
  for (int64_t l : labels) mark(l, reason);
}

namespace {

// Small union-find over the units, to group those that share a (module, role).
struct UnitSets {
  std::vector<size_t> parent;
  size_t find(size_t u) { return parent[u] == u ? u : parent[u] = find(parent[u]); }
};

const char* role_name(ChannelRole role) {
  switch (role) {
    case ChannelRole::Out: return "out";
    case ChannelRole::In: return "in";
    case ChannelRole::Norm: return "norm";
    case ChannelRole::Head: return "head";
    case ChannelRole::Key: return "key";
    case ChannelRole::Value: return "value";
  }
  return "?";
}

}  // namespace

std::unique_ptr<DependencyGraph::Traced> build_groups(Labels& labels, nn::Module& model,
                                                      const DependencyOptions& options) {
  std::map<nn::Module*, std::pair<size_t, std::string>> where;  // module -> (order, name)
  const auto named = model.named_modules();
  for (size_t i = 0; i < named.size(); ++i) where.try_emplace(named[i].second, i, named[i].first);
  auto key = [&](const UnitEntry& e) { return std::make_tuple(where.at(e.module).first, e.role, e.index); };

  // units: classes of labels that hold entries
  std::map<int64_t, size_t> unit_of_root;
  std::vector<std::vector<UnitEntry>> units;
  std::vector<std::set<std::string>> reasons;
  for (int64_t l = 0; l < labels.size(); ++l) {
    auto [it, made] = unit_of_root.try_emplace(labels.find(l), units.size());
    if (made) units.emplace_back(), reasons.emplace_back();
    const auto& e = labels.entries(l);
    units[it->second].insert(units[it->second].end(), e.begin(), e.end());
    reasons[it->second].insert(labels.reasons(l).begin(), labels.reasons(l).end());
  }
  UnitSets sets{std::vector<size_t>(units.size())};
  std::iota(sets.parent.begin(), sets.parent.end(), size_t{0});
  std::map<std::pair<nn::Module*, ChannelRole>, size_t> first_unit;
  for (size_t u = 0; u < units.size(); ++u) {
    std::sort(units[u].begin(), units[u].end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
    // units writing the same layer's channels (outputs, norms) go together; a layer reading
    // several groups' channels (after a cat) does not tie them, so input roles count only for
    // units that nothing writes (the model's input channels)
    auto reads = [](ChannelRole r) { return r == ChannelRole::In || r == ChannelRole::Key || r == ChannelRole::Value; };
    const bool written =
        std::any_of(units[u].begin(), units[u].end(), [&](const UnitEntry& e) { return !reads(e.role); });
    for (const UnitEntry& e : units[u]) {
      if (written && reads(e.role)) continue;
      auto [it, made] = first_unit.try_emplace({e.module, e.role}, u);
      if (!made) sets.parent[sets.find(u)] = sets.find(it->second);
    }
  }
  std::map<size_t, std::vector<size_t>> members_of;  // set root -> its units with entries
  for (size_t u = 0; u < units.size(); ++u)
    if (!units[u].empty()) members_of[sets.find(u)].push_back(u);
  std::vector<std::vector<size_t>> grouped;
  for (auto& [root, us] : members_of) {
    std::sort(us.begin(), us.end(), [&](size_t a, size_t b) { return key(units[a][0]) < key(units[b][0]); });
    grouped.push_back(us);
  }
  std::sort(grouped.begin(), grouped.end(),
            [&](const auto& a, const auto& b) { return key(units[a[0]][0]) < key(units[b[0]][0]); });

  // a parameter two layers hold (weight tying) cannot be cut for one of them alone
  std::map<const TensorImpl*, std::pair<nn::Module*, std::string>> owner;  // parameter -> (layer, its name)
  std::map<nn::Module*, std::string> shared;                               // layer -> why
  for (const auto& [name, m] : named)
    for (const auto& [pname, p] : m->named_parameters(false)) {
      if (!p.defined()) continue;
      auto [it, first] = owner.try_emplace(p.impl_ptr().get(), m, pname);
      if (first || it->second.first == m) continue;
      const std::string& other = where.at(it->second.first).second;
      shared.try_emplace(m, fmt::format("'{}' shares its parameter '{}' with '{}'", name, pname, other));
      shared.try_emplace(it->second.first,
                         fmt::format("'{}' shares its parameter '{}' with '{}'", other, it->second.second, name));
    }

  auto traced = std::make_unique<DependencyGraph::Traced>();
  for (const auto& us : grouped) {
    DependencyGroup group;
    group.size = static_cast<int64_t>(us.size());
    std::map<std::tuple<size_t, ChannelRole>, GroupMember> members;
    std::set<std::string> why;
    auto& entries = traced->units.emplace_back();
    for (size_t u : us) {
      entries.push_back(units[u]);
      why.insert(reasons[u].begin(), reasons[u].end());
      for (const UnitEntry& e : units[u]) {
        auto [it, made] = members.try_emplace({where.at(e.module).first, e.role});
        if (made) it->second = GroupMember{e.module, where.at(e.module).second, e.role, 0};
        ++it->second.channels;
      }
    }
    for (auto& [k, m] : members) {
      group.members.push_back(m);
      const bool guarded = std::find(options.protected_layers.begin(), options.protected_layers.end(), m.module) !=
                           options.protected_layers.end();
      if (guarded && m.role == ChannelRole::Out) why.insert(fmt::format("'{}' is a protected layer", m.name));
      if (auto it = shared.find(m.module); it != shared.end()) why.insert(it->second);
      if (is_pruned(*m.module)) why.insert(fmt::format("'{}' has a pruning mask (compress::remove it first)", m.name));
    }
    std::vector<std::string> shown(why.begin(), why.end());
    if (shown.size() > 3) shown.resize(3), shown.push_back("...");
    group.unprunable_reason = fmt::format("{}", fmt::join(shown, "; "));
    traced->groups.push_back(std::move(group));
  }
  return traced;
}

}  // namespace strata::compress::detail

namespace strata::compress {

std::string DependencyGroup::to_string() const {
  std::vector<std::string> parts;
  for (const GroupMember& m : members)
    parts.push_back(
        fmt::format("{}.{}({})", m.name.empty() ? "<model>" : m.name, detail::role_name(m.role), m.channels));
  return fmt::format("{} units: {}{}", size, fmt::join(parts, ", "),
                     prunable() ? "" : " - not prunable: " + unprunable_reason);
}

}  // namespace strata::compress
