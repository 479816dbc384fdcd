// FullyShardedDataParallel's process groups: the one group it shards over, or under the hybrid
// strategies a shard group and a replicate group, taken from the options, a 2-d device mesh, or
// (neither given) the ranks split by node as PyTorch's default (each node's ranks shard, the
// ranks with one local index across the nodes replicate). The hybrid groups are checked to form
// a grid (every replicate group's ranks hold one shard rank of shard groups of one size) before
// anything else is communicated, and every rank raises together when they do not.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/ranges.h>

#include <strata/ops/creation.hpp>

#include "dist/fsdp_runtime.h"
#include "dist/working_copy.h"

namespace strata::dist::detail {

namespace {

constexpr int64_t kHostWords = 8;  // 64 bytes of host name, as int64 words

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FullShard";
    case ShardingStrategy::ShardGradOp: return "ShardGradOp";
    case ShardingStrategy::NoShard: return "NoShard";
    case ShardingStrategy::HybridShard: return "HybridShard";
    case ShardingStrategy::HybridShardZero2: return "HybridShardZero2";
  }
  return "?";
}

// Every rank's value of `mine` (int64 words) gathered over `group`, on the CPU.
std::vector<int64_t> allgather_words(ProcessGroup& group, const std::vector<int64_t>& mine, Device device) {
  const auto n = static_cast<int64_t>(mine.size());
  Tensor all = empty({n * group.size()}, TensorOptions(kInt64, device));
  std::vector<Tensor> parts;
  for (int r = 0; r < group.size(); ++r) parts.push_back(all.narrow(0, r * n, n));
  group.allgather(parts, from_vector(mine).to(device))->wait();
  Tensor host = all.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

// The shard group (this node's ranks) and the replicate group (the ranks of this local index on
// every node), split from `base` by the ranks' host names.
FsdpGroups split_by_node(ProcessGroup& base, Device device) {
  std::vector<int64_t> name(kHostWords, 0);
  char host[kHostWords * 8] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::memcpy(name.data(), host, sizeof(host));
  const std::vector<int64_t> all = allgather_words(base, name, device);
  std::map<std::vector<int64_t>, std::vector<int>> nodes;  // host -> base ranks, in order
  std::vector<std::vector<int64_t>> host_of;
  for (int r = 0; r < base.size(); ++r) {
    host_of.emplace_back(all.begin() + r * kHostWords, all.begin() + (r + 1) * kHostWords);
    nodes[host_of.back()].push_back(r);
  }
  std::vector<size_t> counts;
  for (const auto& [h, ranks] : nodes) counts.push_back(ranks.size());
  STRATA_CHECK(std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end(),
               "[FullyShardedDataParallel] without process_group and replicate_group or a device_mesh, the hybrid "
               "strategies shard within each node and replicate across nodes, but the nodes run different numbers "
               "of ranks ({}); give the two groups or a 2-d device_mesh",
               fmt::join(counts, ", "));
  // each rank's node (numbered in the order of the nodes' first ranks) and index within it
  std::vector<int> node_of(static_cast<size_t>(base.size())), local_of(node_of.size());
  std::map<std::vector<int64_t>, int> node_number;
  for (size_t r = 0; r < node_of.size(); ++r) {
    const auto [it, fresh] = node_number.try_emplace(host_of[r], static_cast<int>(node_number.size()));
    const std::vector<int>& ranks = nodes.at(host_of[r]);
    node_of[r] = it->second;
    local_of[r] = static_cast<int>(std::find(ranks.begin(), ranks.end(), static_cast<int>(r)) - ranks.begin());
  }
  const auto me = static_cast<size_t>(base.rank());
  const std::vector<int> global = base.global_ranks();
  std::vector<int> shard_members, replicate_members;  // global ranks, in base-rank order (the split's key)
  for (size_t r = 0; r < node_of.size(); ++r) {
    if (node_of[r] == node_of[me]) shard_members.push_back(global[r]);
    if (local_of[r] == local_of[me]) replicate_members.push_back(global[r]);
  }
  auto shard = split_group(base, node_of[me], base.rank(), shard_members);
  auto replicate = split_group(base, local_of[me], base.rank(), replicate_members);
  return {shard, replicate};
}

// Raises on every rank unless the two groups form a grid with this rank at their crossing.
void check_grid(const FsdpGroups& groups, Device device) {
  ProcessGroup &shard = *groups.shard, &replicate = *groups.replicate;
  const std::vector<int64_t> along_shard = allgather_words(shard, {replicate.size(), replicate.rank()}, device);
  const std::vector<int64_t> along_replicate = allgather_words(replicate, {shard.size(), shard.rank()}, device);
  std::string problem;
  const std::vector<int> s = shard.global_ranks(), r = replicate.global_ranks();
  std::vector<int> common;
  std::vector<int> s_sorted = s, r_sorted = r;
  std::sort(s_sorted.begin(), s_sorted.end());
  std::sort(r_sorted.begin(), r_sorted.end());
  std::set_intersection(s_sorted.begin(), s_sorted.end(), r_sorted.begin(), r_sorted.end(),
                        std::back_inserter(common));
  if (common.size() != 1)
    problem = fmt::format("the shard group (global ranks {}) and the replicate group (global ranks {}) share {} ranks; "
                          "they must cross at this rank only",
                          fmt::join(s, ", "), fmt::join(r, ", "), common.size());
  for (size_t i = 2; i < along_shard.size() && problem.empty(); i += 2)
    if (along_shard[i] != along_shard[0] || along_shard[i + 1] != along_shard[1])
      problem = fmt::format("the shard group (global ranks {}) holds ranks of replicate groups of sizes {} and {} "
                            "(replicate ranks {} and {}); every rank of a shard group must have one replicate rank "
                            "in replicate groups of one size",
                            fmt::join(s, ", "), along_shard[0], along_shard[i], along_shard[1], along_shard[i + 1]);
  for (size_t i = 2; i < along_replicate.size() && problem.empty(); i += 2)
    if (along_replicate[i] != along_replicate[0] || along_replicate[i + 1] != along_replicate[1])
      problem = fmt::format("the replicate group (global ranks {}) holds ranks of shard groups of sizes {} and {} "
                            "(shard ranks {} and {}); the shard groups must be of one size (dividing the ranks "
                            "evenly) and every rank of a replicate group must hold the same shard",
                            fmt::join(r, ", "), along_replicate[0], along_replicate[i], along_replicate[1],
                            along_replicate[i + 1]);
  // the verdict spreads over the shard group, the replicate groups and the shard groups again
  Tensor failed = full({1}, problem.empty() ? 0 : 1, TensorOptions(kInt32, device));
  for (ProcessGroup* g : {&shard, &replicate, &shard}) g->allreduce(failed, ReduceOp::Max)->wait();
  STRATA_CHECK(problem.empty(), "[FullyShardedDataParallel] the hybrid groups do not form a grid: {}", problem);
  STRATA_CHECK(failed.cpu().item<int32_t>() == 0, "[FullyShardedDataParallel] the hybrid groups do not form a grid "
               "on another rank (its error names the cause)");
}

}  // namespace

bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardZero2;
}

FsdpGroups resolve_groups(const FSDPOptions& o, Device device) {
  const bool hybrid = is_hybrid(o.sharding_strategy);
  const char* name = strategy_name(o.sharding_strategy);
  FsdpGroups groups;
  if (o.device_mesh) {
    const DeviceMesh& mesh = *o.device_mesh;
    STRATA_CHECK(!o.process_group && !o.replicate_group, "[FullyShardedDataParallel] give device_mesh or "
                 "process_group (and replicate_group), not both");
    STRATA_CHECK(mesh.ndim() == (hybrid ? 2 : 1),
                 "[FullyShardedDataParallel] {} needs a {}-d device_mesh{}; this one has shape [{}]", name,
                 hybrid ? 2 : 1, hybrid ? " (dim 0 replicates, dim 1 shards)" : " (a 2-d mesh is for HybridShard)",
                 fmt::join(mesh.shape(), ", "));
    groups = hybrid ? FsdpGroups{mesh.get_group(1), mesh.get_group(0)} : FsdpGroups{mesh.get_group(0), nullptr};
  } else if (!hybrid) {
    STRATA_CHECK(!o.replicate_group, "[FullyShardedDataParallel] replicate_group is for HybridShard and "
                 "HybridShardZero2, not {}", name);
    groups = {group_or_default(o.process_group), nullptr};
  } else if (o.replicate_group) {
    STRATA_CHECK(o.process_group != nullptr, "[FullyShardedDataParallel] {}: replicate_group is given without "
                 "process_group (the shard group); give both, or a 2-d device_mesh", name);
    groups = {o.process_group, o.replicate_group};
  }
  if (!groups.shard) {
    auto base = group_or_default(o.process_group);
    STRATA_CHECK(base->is_member(), "[FullyShardedDataParallel] this rank is not a member of the process group");
    groups = split_by_node(*base, device);
  }
  STRATA_CHECK(groups.shard->is_member(), "[FullyShardedDataParallel] this rank is not a member of the {}",
               hybrid ? "shard group" : "process group");
  STRATA_CHECK(!hybrid || groups.replicate->is_member(),
               "[FullyShardedDataParallel] this rank is not a member of the replicate group");
  if (hybrid) check_grid(groups, device);
  return groups;
}

}  // namespace strata::dist::detail
