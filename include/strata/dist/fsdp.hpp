// FullyShardedDataParallel (ZeRO-2 and ZeRO-3), as torch.distributed.fsdp.FullyShardedDataParallel
// with use_orig_params=False. The model is cut into units (the root module and the submodules a
// policy picks); each unit's parameters are flattened into one flat parameter, padded to a
// multiple of the world size, and each rank keeps only its shard of it: the leaf tensors
// parameters() returns, which any strata optimizer steps. A unit's full parameters are gathered
// (all_gather) for its forward and again for its backward, and its gradients are averaged over
// the ranks and scattered (reduce_scatter, Avg) into the shards' .grad (docs/fsdp.md). The hybrid
// strategies shard within a shard group and replicate across a replicate group (a 2-d DeviceMesh);
// backward_prefetch and forward_prefetch issue the next unit's all-gather ahead of its use.
//
//   dist::init_process_group("mpi");
//   Net net;
//   dist::FullyShardedDataParallel fsdp(net, {.auto_wrap_policy = dist::module_wrap_policy<Block>()});
//   optim::AdamW opt(fsdp.parameters(), {.lr = 1e-3});      // this rank's shards only
//   for (...) {
//     Tensor loss = nn::functional::cross_entropy(fsdp(x_local), y_local);
//     loss.backward();                                      // shards' .grad: the mean over ranks
//     fsdp.clip_grad_norm_(1.0);                             // the norm over every shard
//     opt.step();
//     opt.zero_grad();
//   }
//   nn::StateDict model = fsdp.full_state_dict();             // the plain model's, on rank 0
//   optim::StateDict state = fsdp.full_optim_state_dict(opt); // a plain AdamW's over net.parameters()
//
// Construction, forward, backward, full_state_dict, load_*, summon_full_params and the optimizer
// state calls are collective: every rank calls them in the same order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <strata/autograd/graph.hpp>
#include <strata/dist/device_mesh.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>
#include <strata/optim/optimizer.hpp>

namespace strata::dist {

namespace detail {
class FsdpRuntime;
}

/// What each rank keeps between uses (torch.distributed.fsdp.ShardingStrategy).
enum class ShardingStrategy : uint8_t {
  FullShard,    ///< ZeRO-3: parameters, gradients and optimizer state sharded; parameters gathered
                ///< for each unit's forward and again for its backward, freed after each
  ShardGradOp,  ///< ZeRO-2: gathered for the forward and kept whole until the backward ends
  NoShard,      ///< DDP: every rank keeps everything; gradients all-reduced
  HybridShard,  ///< FullShard within a shard group, the shards replicated across a replicate group
                ///< (their reduced gradients all-reduced over it): torch's HYBRID_SHARD
  HybridShardZero2,  ///< ShardGradOp within the shard group, replicated likewise (_HYBRID_SHARD_ZERO2)
};

/// When the backward issues the next unit's all-gather (torch.distributed.fsdp.BackwardPrefetch):
/// the next unit is the one after the current in the reverse of the forward's order.
enum class BackwardPrefetch : uint8_t {
  None,          ///< each unit gathered when its backward starts
  BackwardPre,   ///< when a unit's backward starts, before its gradients are computed (torch's default)
  BackwardPost,  ///< once a unit's gradients are all in, before its reduction is issued
};

/// One step of a unit's all-gather, recorded for inspection (record_gather_events).
struct GatherEvent {
  enum Kind : uint8_t {
    Issue,     ///< issued when the unit needed it
    Prefetch,  ///< issued ahead of its use (backward_prefetch, forward_prefetch)
    Wait,      ///< waited for: the unit's parameters point at the gathered values
  };
  Kind kind;
  size_t unit;
  bool backward;  ///< inside a backward pass
  bool operator==(const GatherEvent&) const = default;
};

/// Decides whether a submodule becomes a unit of its own: (its dotted name, the module, the number
/// of parameter elements it holds that no unit below it holds). Called children before parents.
using AutoWrapPolicy = std::function<bool(const std::string& name, nn::Module& module, int64_t unwrapped_numel)>;

/// torch's size_based_auto_wrap_policy: a submodule becomes a unit when it holds at least
/// `min_num_params` parameter elements not already in a unit below it.
STRATA_API AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params);
/// torch's ModuleWrapPolicy: every submodule of one of the types M... becomes a unit.
template <class... M> AutoWrapPolicy module_wrap_policy() {
  return [](const std::string&, nn::Module& m, int64_t) { return ((dynamic_cast<M*>(&m) != nullptr) || ...); };
}

/// torch.distributed.fsdp.MixedPrecision. The shards (the optimizer's master parameters) keep
/// their dtype; a unit's gathered parameters are cast to `param_dtype` for the forward and
/// backward, its gradients reduced in `reduce_dtype` (param_dtype when unset) and cast back into
/// the shards' .grad, and the module's floating buffers kept in `buffer_dtype`. Unset: unchanged.
struct MixedPrecision {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> buffer_dtype;
  /// forward(input) casts a floating input to param_dtype (torch's cast_root_forward_inputs);
  /// forward_with's callable casts its own.
  bool cast_root_forward_inputs = true;
};

/// torch.distributed.fsdp.CPUOffload: with offload_params, the shards (and so their gradients and
/// the optimizer's state and step) live in CPU memory, while the module computes on its device:
/// a gather copies the shard to the device, the reduced gradient comes back to the CPU.
struct CPUOffload {
  bool offload_params = false;
};

struct FSDPOptions {
  /// The group to shard over; the default group when null. Under the hybrid strategies, the shard
  /// group (with replicate_group: torch's process_group=(shard, replicate)), or the group split
  /// into nodes when neither it nor device_mesh gives the two groups.
  std::shared_ptr<ProcessGroup> process_group = nullptr;
  /// Hybrid strategies only: the group of the ranks holding the same shard (one per shard group).
  std::shared_ptr<ProcessGroup> replicate_group = nullptr;
  /// Instead of the groups: a 1-d mesh (its group shards), or under the hybrid strategies a 2-d
  /// mesh, dim 0 replicating and dim 1 sharding (torch's device_mesh).
  std::optional<DeviceMesh> device_mesh = std::nullopt;
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;
  /// Picks the units below the root; with neither this nor wrap_modules, the root is the only unit.
  AutoWrapPolicy auto_wrap_policy = nullptr;
  /// Units named explicitly (submodules of the wrapped module), besides what the policy picks.
  std::vector<nn::Module*> wrap_modules;
  /// Broadcast rank 0's parameters and buffers at construction (torch's sync_module_states).
  bool sync_module_states = true;
  /// Lower-precision compute and reduction (docs/fsdp.md); off when every dtype is unset.
  MixedPrecision mixed_precision = {};
  /// Shards on the CPU for a module on a GPU; for a CPU module it changes nothing.
  CPUOffload cpu_offload = {};
  /// Issue the next unit's all-gather ahead of its backward (docs/fsdp.md, Prefetching).
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BackwardPre;
  /// Issue the next unit's all-gather (in the previous forward's order) when a unit's forward starts.
  bool forward_prefetch = false;
};

/// Wraps a module (not owned: it must outlive the wrapper) for fully sharded data-parallel
/// training. After construction the module's parameters are placeholders that FSDP fills with
/// the gathered values while they are needed (0-element tensors otherwise, under FullShard and
/// ShardGradOp); use summon_full_params() to see or change them, full_state_dict() to save them.
class STRATA_API FullyShardedDataParallel {
 public:
  explicit FullyShardedDataParallel(nn::Module& module, FSDPOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  /// Runs the module's forward; the tensors its ops save for the backward that alias a unit's
  /// gathered parameters are kept as references and re-gathered in the backward; the others go to
  /// the caller's saved-tensor hooks when some are active (activation checkpointing around it).
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  /// The same for a forward of any other signature: `fn` calls the module and returns its output.
  template <class F> auto forward_with(F&& fn) {
    auto scope = begin_forward();
    try {
      return std::forward<F>(fn)();
    } catch (const Error& e) {
      rethrow_forward_error(e);
    }
  }

  /// This rank's shards, one flat 1-d leaf per unit (unit order), for the optimizer; then those
  /// of the wrappers nested in the module (docs/fsdp.md, Nested wrappers), in module order.
  std::vector<Tensor> parameters() const;
  nn::Module& module() { return module_; }
  /// The group the parameters are sharded over (the shard group under the hybrid strategies).
  std::shared_ptr<ProcessGroup> process_group() const;
  /// The hybrid strategies' replicate group; null under the others.
  std::shared_ptr<ProcessGroup> replicate_group() const;
  ShardingStrategy sharding_strategy() const;
  const MixedPrecision& mixed_precision() const;
  FullyShardedDataParallel& train(bool on = true);
  FullyShardedDataParallel& eval() { return train(false); }

  /// The units' module names ("" for the root), in unit order (pre-order of the module tree).
  std::vector<std::string> unit_names() const;
  /// The dotted names (as the root's named_parameters()) of the parameters unit `unit` manages.
  std::vector<std::string> unit_parameter_names(size_t unit) const;
  /// Whether unit `unit`'s full parameters exist now on this rank.
  bool is_gathered(size_t unit) const;
  /// From `on` until it is called with false, the all-gathers' issues and waits are recorded
  /// (gather_events()), to check when prefetching issues them. Turning it on clears the record.
  void record_gather_events(bool on = true);
  std::vector<GatherEvent> gather_events() const;

  /// While the guard lives, backward passes only accumulate the full, unreduced gradients on the
  /// module's parameters (no communication; a FullShard unit still frees its parameters); the
  /// first backward after it reduces the accumulated sum (torch's `with fsdp.no_sync():`).
  class STRATA_API NoSyncGuard {
   public:
    explicit NoSyncGuard(std::shared_ptr<detail::FsdpRuntime> runtime);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    std::vector<std::pair<std::shared_ptr<detail::FsdpRuntime>, bool>> previous_;  // nested ones too
  };
  [[nodiscard]] NoSyncGuard no_sync();

  /// Every unit gathered while the guard lives, so the module's parameters hold the full values
  /// (torch's summon_full_params), in the shards' dtype (and buffers in their own) under mixed
  /// precision. With writeback, changes made to them reach the shards when it
  /// ends. Entering is collective; parameters must not be used under autograd meanwhile.
  class STRATA_API FullParamsGuard {
   public:
    FullParamsGuard(std::shared_ptr<detail::FsdpRuntime> runtime, bool writeback);
    ~FullParamsGuard();
    FullParamsGuard(const FullParamsGuard&) = delete;
    FullParamsGuard& operator=(const FullParamsGuard&) = delete;

   private:
    std::shared_ptr<detail::FsdpRuntime> runtime_;
    bool writeback_;
    std::vector<std::unique_ptr<FullParamsGuard>> nested_;  // the nested wrappers', entered after
  };
  [[nodiscard]] FullParamsGuard summon_full_params(bool writeback = true);

  /// Clips the shards' gradients by the norm of all of them taken together (every rank's), as
  /// optim::clip_grad_norm_ on the whole model would, and returns that norm. Collective.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);

  /// The plain module's state dict (its names, shapes and buffers), with cloned values; on rank 0
  /// only when rank0_only (empty elsewhere; hybrid: rank 0 of both groups). Collective.
  nn::StateDict full_state_dict(bool rank0_only = true);
  /// Loads a plain module's state dict (every rank passes the same one). On any mismatch every
  /// rank raises and nothing changes. Collective.
  void load_full_state_dict(const nn::StateDict& dict, bool strict = true);
  /// This rank's part: "_fsdp.world_size", "_fsdp.rank" (the shard group's), per unit u "_fsdp.unit.<u>.numel" (int64
  /// scalars) and "_fsdp.unit.<u>.shard" (the shard), and the module's persistent buffers under
  /// their names. Local: no communication.
  nn::StateDict sharded_state_dict() const;
  /// Loads what sharded_state_dict() wrote on the same rank of a group of the same size over the
  /// same model; raises naming the world size, rank or unit that differs, before writing anything.
  void load_sharded_state_dict(const nn::StateDict& dict);

  /// `opt`'s state (an optimizer over parameters(), in any groups) in the layout a plain optimizer
  /// of its type writes over the module's own parameters: group g holds the parameters of the
  /// units whose shards are in group g, in the module's parameters() order; each parameter gets
  /// its unit's scalars and its part of the unit's state tensors. On rank 0 only when rank0_only.
  /// Collective.
  optim::StateDict full_optim_state_dict(const optim::Optimizer& opt, bool rank0_only = true);
  /// Loads such a state dict (from any world size; every rank passes the same one) into `opt`.
  /// On any mismatch every rank raises and `opt` is unchanged. Collective.
  void load_full_optim_state_dict(optim::Optimizer& opt, const optim::StateDict& full);

 private:
  std::unique_ptr<autograd::SavedTensorHooksGuard> begin_forward();
  [[noreturn]] void rethrow_forward_error(const Error& e) const;

  nn::Module& module_;
  std::shared_ptr<detail::FsdpRuntime> runtime_;
};

}  // namespace strata::dist
