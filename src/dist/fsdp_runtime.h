// FullyShardedDataParallel's state: the units with their flat parameters, and the forward and
// backward steps the module and autograd hooks drive (Note [FSDP units] in fsdp_runtime.cpp).
#pragma once

#include <any>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <strata/dist/fsdp.hpp>

namespace strata::dist::detail {

/// One unit: the parameters it manages laid end to end in one flat parameter of `padded`
/// elements (numel rounded up to a multiple of the shard count), this rank's shard of it, and
/// the gathered flat parameter while it exists.
struct FlatUnit {
  std::string name;  // the module's dotted name, "" for the root
  nn::Module* module = nullptr;
  std::vector<Tensor> params;  // the module's own parameter handles (leaves), in flat order
  Device device;               // where the module computes (the shard is on the CPU under CPU offload)
  std::vector<std::string> param_names;
  std::vector<int64_t> offsets;  // of each parameter in the flat parameter
  std::vector<Shape> shapes;
  std::vector<int64_t> numels;
  int64_t numel = 0, padded = 0;
  bool requires_grad = false;
  Tensor shard;  // the leaf the optimizer steps: [padded / shards]
  Tensor full;   // the gathered flat parameter [padded]; undefined while freed
  int64_t gathered_version = 0;  // the shard's version when `full` was gathered from it
  std::vector<bool> used;        // per parameter: in the graph of a forward since the last backward
  std::vector<bool> awaited;     // per parameter: its gradient is still due in this backward
  // an all-gather in flight (issued ahead of its use, or about to be waited for)
  Tensor pending;
  std::shared_ptr<Work> gather_work;
  int64_t pending_version = 0;
  bool prefetched = false;  // gathered ahead of its use, not used since
  bool forwarded = false;   // its forward has started in this pass
  bool backward_started = false;  // its backward has started in this pass
  bool needs_backward = false;    // an output of its forward in this pass requires grad (PyTorch's
                                  // _needs_pre_backward_unshard): only such a unit is prefetched for a backward
  // the backward pass in progress
  size_t grads_pending = 0;
  bool done = false;   // every gradient in (or counted missing at the end)
  Tensor flat_grad;    // the flattened local gradients, until their reduction starts
  Tensor reduced;      // where the reduction writes this rank's part
  std::shared_ptr<Work> work;  // the reduction (hybrid: the reduce-scatter, then the all-reduce)
};

/// The group the parameters are sharded over and, under the hybrid strategies, the group that
/// replicates the shards (null otherwise).
struct FsdpGroups {
  std::shared_ptr<ProcessGroup> shard, replicate;
};
bool is_hybrid(ShardingStrategy s);
/// From the options (fsdp_groups.cpp): checks them, and under the hybrid strategies that the two
/// groups form a grid (raising on every rank together otherwise). Collective. `device`: where
/// the small tensors it communicates live.
FsdpGroups resolve_groups(const FSDPOptions& options, Device device);

class FsdpRuntime : public std::enable_shared_from_this<FsdpRuntime> {
 public:
  /// `group` shards; `replicate` (hybrid strategies only, else null) replicates the shards.
  FsdpRuntime(nn::Module& root, std::shared_ptr<ProcessGroup> group, std::shared_ptr<ProcessGroup> replicate,
              const FSDPOptions& options, std::vector<FlatUnit> units);
  /// Flattens and shards the parameters' current values, frees them (FullShard, ShardGradOp) and
  /// registers the hooks; the hooks hold the runtime weakly.
  void install();
  /// Removes the module hooks (the gradient hooks do nothing once the runtime is gone).
  void uninstall();

  ProcessGroup& group() const { return *group_; }
  std::shared_ptr<ProcessGroup> group_ptr() const { return group_; }
  std::shared_ptr<ProcessGroup> replicate_ptr() const { return replicate_; }
  ShardingStrategy strategy() const { return strategy_; }
  bool sharded() const { return strategy_ != ShardingStrategy::NoShard; }
  /// FullShard and HybridShard free a unit after its forward and after its backward.
  bool frees_after_forward() const {
    return strategy_ == ShardingStrategy::FullShard || strategy_ == ShardingStrategy::HybridShard;
  }
  /// Rank 0 of the shard group and of the replicate group: the rank that rank0_only means.
  bool is_rank0() const { return group_->rank() == 0 && (!replicate_ || replicate_->rank() == 0); }
  /// Raises on every rank of both groups when some rank's `error` is set (model_sync.h's
  /// agree_on_error over the shard group, then the replicate group).
  void agree_on_error(std::exception_ptr error, const char* what) const;
  int64_t shard_count() const { return sharded() ? group_->size() : 1; }
  const MixedPrecision& mixed_precision() const { return mixed_precision_; }
  /// The dtype unit `u`'s parameters are gathered in for compute, and its gradients reduced in.
  DType compute_dtype(const FlatUnit& unit) const { return mixed_precision_.param_dtype.value_or(unit.shard.dtype()); }
  DType reduce_dtype(const FlatUnit& unit) const {
    return mixed_precision_.reduce_dtype.value_or(compute_dtype(unit));
  }
  std::vector<FlatUnit>& units() { return units_; }
  const std::vector<FlatUnit>& units() const { return units_; }

  /// Gathers unit `u`'s flat parameter (if freed) and points its parameters at their parts: in the
  /// compute dtype, or the shard's own (`master`, for summon_full_params).
  void gather(size_t u, bool master = false);
  /// Drops the gathered flat parameter: the parameters become 0-element tensors. NoShard keeps it.
  void free(size_t u);
  /// Drops it whatever the strategy (a NoShard unit's cast copy or master view is made again).
  void release(size_t u);
  /// At the end of summon_full_params: frees a unit that was not gathered before it, and drops a
  /// master-precision copy that the compute needs in another dtype.
  void end_summon(size_t u, bool was_gathered);
  /// Mixed precision's buffer_dtype: casts the wrapped module's floating buffers to it, remembering
  /// their own dtypes, or back to those (`original`).
  void cast_buffers(bool original);
  /// A buffer as the state dicts hold it: in its own dtype (a cast copy under buffer_dtype).
  Tensor original_buffer(const Tensor& buffer) const;
  /// Copies this rank's part of the gathered flat parameter back into its shard.
  void write_back(size_t u);

  /// Saved-tensor hooks: a tensor aliasing a gathered flat parameter is kept as its place in it
  /// and rebuilt from the (re-)gathered one in the backward; others are kept as they are.
  std::any pack(const Tensor& t);
  Tensor unpack(const std::any& packed);

  /// Before a forward or backward: forgets a backward pass that raised before its end, dropping the
  /// gradients it left on the module's parameters (no_sync's accumulated ones too).
  void reset();
  /// At the start of a wrapper forward: forgets which graph nodes the units' outputs were traced through.
  void begin_forward_pass();
  /// The wrappers nested in this one's module tree (built before it).
  std::vector<std::weak_ptr<FsdpRuntime>> nested;
  /// This runtime, then every nested one (depth first); raises when a nested wrapper is gone.
  std::vector<std::shared_ptr<FsdpRuntime>> with_nested();
  /// The modules this wrapper marked as wrapped (its tree less the nested wrappers' trees).
  std::vector<const nn::Module*> own_modules;
  /// The recorded all-gather events (FullyShardedDataParallel::record_gather_events).
  std::optional<std::vector<GatherEvent>> gather_events;
  bool sync = true;  // false under no_sync()
  bool summoned = false;  // inside summon_full_params()
  std::vector<bool> gathered_before_summon;

 private:
  void start_gather(size_t u, DType dtype, GatherEvent::Kind kind);
  void complete_gather(size_t u);
  void record(GatherEvent::Kind kind, size_t u);
  /// Issues unit `u`'s all-gather ahead of its use, unless it is gathered or in flight.
  void prefetch(size_t u);
  void prefetch_after_forward_of(size_t u);
  void prefetch_after_backward_of(size_t u);
  /// Frees the units gathered ahead of a use that never came.
  void drop_prefetched();
  void pre_forward(size_t u);
  void post_forward(size_t u, const std::vector<Tensor>& outputs);
  void pre_backward(size_t u);
  void on_gradient(size_t u, size_t k);
  void trace_used(const std::vector<Tensor>& outputs);
  void begin_backward();
  void unit_done(size_t u);
  void start_ready_reductions();
  /// Hybrid: waits for unit `u`'s reduce-scatter and all-reduces its part over the replicate group.
  void replicate_reduction(size_t u);
  void finish_backward();

  nn::Module& root_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<ProcessGroup> replicate_;
  ShardingStrategy strategy_;
  BackwardPrefetch backward_prefetch_;
  bool forward_prefetch_;
  bool offload_params_;
  std::vector<FlatUnit> units_;
  MixedPrecision mixed_precision_;
  std::unordered_map<const Storage*, DType> buffer_dtypes_;  // a cast buffer's memory -> its own dtype
  std::unordered_map<const Storage*, size_t> gathered_;  // a gathered flat parameter's storage -> unit
  std::vector<nn::RemovableHandle> handles_;
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> param_at_;  // -> (unit, index)
  std::unordered_set<uint64_t> traced_;  // sequence numbers of the nodes trace_used has walked
  bool in_backward_ = false;
  std::weak_ptr<void> pass_alive_;  // expired when the pass raised (the engine drops its callback)
  size_t next_reduction_ = 0;       // units reduce last first, the same order on every rank
  size_t unreplicated_ = SIZE_MAX;  // hybrid: the unit whose reduce-scatter awaits its all-reduce
  // the order the units' forwards started in the last pass (forward prefetch), and ended in this
  // one (its reverse is the backward's prefetch order); each unit once
  std::vector<size_t> last_forward_order_, forward_order_, post_forward_order_;
};

}  // namespace strata::dist::detail
