// ZeRO stage 1 (Rajbhandari et al. 2020), as torch.distributed.optim.ZeroRedundancyOptimizer: the
// optimizer state is sharded over the ranks of a group. Each parameter is owned by one rank
// (PyTorch's greedy partition by size); each rank builds the wrapped optimizer over its own
// parameters only, so it keeps only their state, steps them, and then every rank receives the
// updated parameters from their owners (one broadcast per owner and bucket), so the parameters
// end identical, bit for bit, on every rank. Gradients must be the same on every rank for the
// replicas to stay one model: DistributedDataParallel's averaged ones, or any the caller makes so.
//
//   dist::DistributedDataParallel ddp(net);
//   dist::ZeroRedundancyOptimizer<optim::AdamW> opt(net.parameters(), {.lr = 1e-3});
//   optim::LambdaLR sched(opt, warmup);          // schedulers, GradScaler and checkpoints take it
//   ...  loss.backward();  opt.step();  opt.zero_grad();  sched.step();
//   opt.consolidate_state_dict(0);               // every rank; then rank 0's state_dict() is the
//   if (rank == 0) save(opt.state_dict());       // plain AdamW's, loadable at any world size
//
// step(), consolidate_state_dict() and load_state_dict() are collective over the group: every
// rank calls them, in the same order.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/dist/ddp.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/optim/optimizer.hpp>

namespace strata::dist {

struct ZeroOptions {
  std::shared_ptr<ProcessGroup> process_group = nullptr;  // the default group when null
  /// The largest broadcast of updated parameters, in MiB: an owner's parameters of one dtype travel
  /// in buckets of at most this size (a larger parameter alone).
  double broadcast_bucket_mb = 25;
};

namespace detail {

/// The part of ZeroRedundancyOptimizer that does not depend on the wrapped optimizer's type: the
/// partition of the parameters, the broadcasts, and the state dict exchange. Parameter indices are
/// global (counted across the groups in order, as StateDict keys) or local (across this rank's
/// parameters of each group in order, as the wrapped optimizer's keys).
class STRATA_API ZeroShards {
 public:
  explicit ZeroShards(const ZeroOptions& options);

  ProcessGroup& group() const { return *group_; }
  /// Assigns the parameters of the groups not assigned yet (those after num_groups()), each
  /// group's largest first, each to the rank with the fewest elements so far (PyTorch's greedy
  /// partition: earlier assignments never move). `groups` holds every group's parameters.
  void assign(const std::vector<std::vector<Tensor>>& groups);
  size_t num_groups() const { return params_.size(); }
  /// The rank owning global parameter `index`.
  int owner(size_t index) const { return owner_.at(index); }
  /// This rank's parameters of each group (some may be empty).
  std::vector<std::vector<Tensor>> local_groups() const;
  bool owns_any() const { return !local_to_global_.empty(); }

  /// Raises, on every rank alike, when a gradient's shape, dtype or device is not its parameter's.
  void check_grads(const std::string& name) const;
  /// Every rank receives each owner's parameters from it.
  void broadcast_params();
  /// The same for the parameters among `params` (others are skipped), without waiting: one
  /// broadcast per owner that has some, in rank order; finish_broadcasts() waits for all started
  /// and writes the received values into the parameters.
  void start_broadcasts(const std::vector<Tensor>& params);
  void finish_broadcasts();
  /// Whether `param` is one of the parameters assigned so far.
  bool holds(const Tensor& param) const { return global_index_.count(param.impl_ptr().get()) > 0; }
  /// Raises, on every rank, when some rank's `error` is set: that error on its own rank, one
  /// naming the first failing rank elsewhere. Collective.
  void agree(std::exception_ptr error, const char* what) const;

  /// `local` (this rank's wrapped optimizer's state dict, null when it owns nothing) sent to rank
  /// `to`, which returns every rank's "state.*" entries under global indices (empty elsewhere).
  optim::StateDict gather_state(const optim::StateDict* local, int to) const;
  /// The part of a full state dict (every parameter's, as one process's optimizer writes it) for
  /// this rank's wrapped optimizer, whose group layout the caller has checked. Raises on an entry
  /// of no parameter.
  optim::StateDict local_dict(const optim::StateDict& full) const;

 private:
  Device params_device() const;  // where the exchanges' small tensors live: the first parameter's device

  std::shared_ptr<ProcessGroup> group_;
  size_t bucket_bytes_;
  std::vector<std::vector<Tensor>> params_;  // every group's, as assigned
  std::vector<int> owner_;                   // by global index
  std::vector<int64_t> local_of_global_;     // -1 when another rank owns it
  std::vector<size_t> local_to_global_;
  std::vector<int64_t> numel_per_rank_;
  std::unordered_map<const TensorImpl*, size_t> global_index_;
  struct Broadcast {
    std::shared_ptr<Work> work;
    Tensor flat;
    std::vector<Tensor> params;  // written from `flat` once it arrives (on the ranks that receive)
  };
  std::vector<Broadcast> in_flight_;
  /// Starts the broadcast of `params` (one dtype and device) from `owner`.
  void start_broadcast(std::vector<Tensor> params, int owner);
};

template <class O>
O options_of(const optim::OptimizerFor<O>*);

/// `dict` without its "state.*" entries: the groups' part of a full state dict.
STRATA_API optim::StateDict without_states(const optim::StateDict& dict);

}  // namespace detail

/// ZeRO-1 over any optimizer type `Opt` derived from OptimizerFor<Options> with a constructor
/// Opt(std::vector<ParamGroup<Options>>, Options). It is itself an optimizer of Options whose
/// groups hold every parameter: schedulers and the user change their hyperparameters, which
/// reach the wrapped optimizer at each step; name() is the wrapped optimizer's, so its state
/// dicts and checkpoints are interchangeable with a plain `Opt`'s.
template <class Opt>
class ZeroRedundancyOptimizer : public optim::OptimizerFor<decltype(detail::options_of(static_cast<Opt*>(nullptr)))> {
 public:
  using Options = decltype(detail::options_of(static_cast<Opt*>(nullptr)));
  using Base = optim::OptimizerFor<Options>;
  using Group = optim::ParamGroup<Options>;

  explicit ZeroRedundancyOptimizer(std::vector<Tensor> params, Options options = {}, ZeroOptions zero = {})
      : ZeroRedundancyOptimizer(std::vector<Group>{Group(std::move(params), options)}, options, std::move(zero)) {}
  explicit ZeroRedundancyOptimizer(std::vector<Group> groups, Options defaults = {}, ZeroOptions zero = {})
      : Base(wrapped_name(groups, defaults), groups, defaults), shards_(zero) {
    sync_partition();
  }

  /// Steps this rank's parameters with the wrapped optimizer, then broadcasts every rank's.
  Tensor step(const std::function<Tensor()>& closure = {}) override {
    STRATA_CHECK(!overlapping_,
                 "[ZeroRedundancyOptimizer] step: with overlap_with_ddp the steps run in DDP's backward, bucket by "
                 "bucket; take step() out of the training loop");
    Tensor loss;
    // what every rank can check alone, agreed on before any parameter changes
    std::exception_ptr error;
    try {
      if (closure) {
        EnableGradGuard enable;
        loss = closure();
      }
      sync_partition();
      this->check_all_options();
      this->check_params();
      shards_.check_grads(this->name());
      sync_options();
    } catch (...) {
      error = std::current_exception();
    }
    shards_.agree(error, "step");
    try {
      if (local_) local_->step();
    } catch (...) {
      error = std::current_exception();
    }
    // Even when a rank's step failed midway, every rank receives each owner's parameters as they
    // are (the shards that stepped keep their update), so the replicas stay one model; the states
    // changed, so a consolidated dict is stale either way.
    shards_.broadcast_params();
    ++steps_;
    shards_.agree(error, "step");
    return loss;
  }

  /// Collects every rank's state on rank `to` (a group rank), whose state_dict() then returns it.
  /// Collective.
  void consolidate_state_dict(int to = 0) {
    STRATA_CHECK(to >= 0 && to < shards_.group().size(),
                 "[ZeroRedundancyOptimizer] consolidate_state_dict: rank {} is out of range for a group of {}", to,
                 shards_.group().size());
    sync_partition();
    sync_options();
    std::optional<optim::StateDict> local;
    if (local_) local = local_->state_dict();
    optim::StateDict states = shards_.gather_state(local ? &*local : nullptr, to);
    consolidated_.reset();
    if (shards_.group().rank() != to) return;
    consolidated_ = std::move(states);
    consolidated_at_ = steps_;
  }

  /// The whole state, in the layout a plain `Opt` over the same groups writes, on the rank that
  /// consolidate_state_dict() last collected it on, before any further step. The groups'
  /// hyperparameters are their current ones (as PyTorch's), a scheduler step after consolidating
  /// included.
  optim::StateDict state_dict() const override {
    STRATA_CHECK(consolidated_.has_value(),
                 "[ZeroRedundancyOptimizer] state_dict: the state has not been consolidated on rank {}; call "
                 "consolidate_state_dict(to) on every rank first and state_dict() on rank `to`",
                 shards_.group().rank());
    STRATA_CHECK(consolidated_at_ == steps_,
                 "[ZeroRedundancyOptimizer] state_dict: the consolidated state is {} step(s) old; call "
                 "consolidate_state_dict(to) again",
                 steps_ - consolidated_at_);
    optim::StateDict full = Base::state_dict();  // the groups' entries: the wrapper keeps no state itself
    full.scalars.insert(consolidated_->scalars.begin(), consolidated_->scalars.end());
    full.tensors = consolidated_->tensors;
    return full;
  }

  /// Loads a whole state dict (a plain `Opt`'s or a consolidated one, from any world size), each
  /// rank keeping its shard. Collective: every rank passes the same dict; on any mismatch every
  /// rank raises and nothing changes.
  void load_state_dict(const optim::StateDict& full) override {
    sync_partition();
    std::function<void()> undo;
    std::exception_ptr error;
    try {
      undo = restore_point();
      // the type, the group layout, the groups' hyperparameters and initial_lr, as a plain Opt
      // checks and loads them (all or nothing)
      Base::load_state_dict(detail::without_states(full));
      optim::StateDict local = shards_.local_dict(full);
      if (local_) local_->load_state_dict(local);
    } catch (...) {
      error = std::current_exception();
    }
    try {
      shards_.agree(error, "load_state_dict");
    } catch (...) {
      if (undo) undo();
      throw;
    }
    consolidated_.reset();
  }

  /// This rank's part of the state (the groups' hyperparameters and its shard), put back without
  /// any collective call.
  std::function<void()> restore_point() override {
    auto groups = std::make_shared<optim::StateDict>(Base::state_dict());
    auto shard = std::make_shared<std::optional<optim::StateDict>>();
    if (local_) *shard = local_->state_dict();
    return [this, groups, shard] {
      Base::load_state_dict(*groups);
      if (local_ && shard->has_value()) local_->load_state_dict(**shard);
      consolidated_.reset();
    };
  }

  /// PyTorch's overlap_with_ddp with hook_with_zero_step: from now on every synchronized backward
  /// of `ddp` steps the parameters itself, bucket by bucket: as each bucket's averaged gradients
  /// arrive, this rank steps its parameters in it and the owners' broadcasts of the bucket start,
  /// while the later buckets are still reduced; the backward returns with every parameter
  /// updated, identical on every rank, and step() is no longer called (it raises). Every
  /// parameter must be in one of ddp's buckets; `ddp` must outlive the training (this optimizer
  /// may go first: its hook then does nothing). The wrapped optimizer must update each parameter
  /// from its own state only (all the built-in ones), as it steps a bucket's parameters at a time.
  /// An error (step()'s checks, or the wrapped optimizer's) raises from the backward on every
  /// rank, once all buckets are written: the failing rank's shard is left as it was, but the
  /// other ranks' shards have stepped (step() changes nothing when its checks fail); every rank
  /// still holds the same parameters.
  void overlap_with_ddp(DistributedDataParallel& ddp) {
    sync_partition();
    std::unordered_set<const TensorImpl*> bucketed;
    for (const Tensor& p : ddp.parameters())
      if (p.requires_grad()) bucketed.insert(p.impl_ptr().get());
    check_bucketed(bucketed);
    bucketed_ = std::move(bucketed);
    overlapping_ = true;
    std::weak_ptr<bool> alive = alive_;
    ddp.register_bucket_hook([this, alive](const GradBucket& bucket) {
      if (alive.lock()) step_bucket(bucket);
    });
  }

  /// The wrapped optimizer over this rank's parameters (its state is this rank's shard); null
  /// when the rank owns no parameter.
  Opt* local_optimizer() { return local_.get(); }
  const Opt* local_optimizer() const { return local_.get(); }
  /// The rank owning `param` (a group rank).
  int rank_of(const Tensor& param) const {
    size_t index = 0;
    for (size_t g = 0; g < this->num_param_groups(); ++g)
      for (const Tensor& p : this->group_params(g)) {
        if (p.is_same(param)) return shards_.owner(index);
        ++index;
      }
    strata::detail::throw_error("[ZeroRedundancyOptimizer] rank_of: the tensor is not one of the parameters");
  }

 protected:
  // never called: step() hands the update to the wrapped optimizer
  void update(size_t, const Tensor&, const Tensor&, optim::ParamState&) override {
    strata::detail::throw_error("[ZeroRedundancyOptimizer] update() is the wrapped optimizer's");
  }
  std::vector<optim::StateSpec> state_specs(size_t, const Tensor&) const override { return {}; }

 private:
  // The wrapped optimizer's name; its constructor checks the parameters and options first.
  static std::string wrapped_name(const std::vector<Group>& groups, const Options& defaults) {
    size_t total = 0;
    for (const Group& g : groups) total += g.params.size();
    STRATA_CHECK(total > 0, "[ZeroRedundancyOptimizer] got an empty parameter list");
    return Opt(groups, defaults).name();
  }

  // Assigns the groups added since the last call (add_param_group) and gives them to `local_`.
  void sync_partition() {
    const auto& groups = this->param_groups();
    const size_t first_new = shards_.num_groups();
    if (first_new == groups.size()) return;
    std::vector<std::vector<Tensor>> params;
    for (const Group& g : groups) params.push_back(g.params);
    shards_.assign(params);
    std::vector<std::vector<Tensor>> mine = shards_.local_groups();
    if (local_) {
      for (size_t g = first_new; g < groups.size(); ++g) local_->add_param_group(Group(mine[g], groups[g].options));
    } else if (shards_.owns_any()) {
      std::vector<Group> local_groups;
      for (size_t g = 0; g < groups.size(); ++g) local_groups.emplace_back(mine[g], groups[g].options);
      local_ = std::make_unique<Opt>(std::move(local_groups), this->defaults());
    }
  }
  // PyTorch's _sync_param_groups: the hyperparameters set here (by schedulers) reach `local_`.
  void sync_options() {
    if (!local_) return;
    for (size_t g = 0; g < this->num_param_groups(); ++g)
      local_->param_groups()[g].options = this->param_groups()[g].options;
  }

  // Every parameter is one of DDP's (`bucketed`), or no backward would step it.
  void check_bucketed(const std::unordered_set<const TensorImpl*>& bucketed) const {
    size_t index = 0;
    for (size_t g = 0; g < this->num_param_groups(); ++g)
      for (const Tensor& p : this->group_params(g)) {
        STRATA_CHECK(bucketed.count(p.impl_ptr().get()),
                     "[ZeroRedundancyOptimizer] overlap_with_ddp: parameter {} is in none of DDP's buckets, so no "
                     "backward would step it",
                     index);
        ++index;
      }
  }

  // overlap_with_ddp's hook: bucket 0 checks what step() checks first; the last bucket waits for
  // every broadcast started, so the backward returns with the parameters in place. A rank's error
  // is held, not raised (the others would wait forever on its broadcasts): the rank stops
  // stepping, still broadcasts its shard as it is, and at the last bucket every rank raises
  // alike, as step() does after a failed local step. There is no agreement before bucket 0's
  // step, as step() has: queued behind every bucket's allreduce, it would end the overlap.
  void step_bucket(const GradBucket& bucket) {
    if (bucket.index == 0) {
      shards_.finish_broadcasts();  // any a pass that raised midway left in flight
      overlap_error_ = nullptr;
      try {
        sync_partition();  // groups added since (stepped where their parameters are bucketed)
        check_bucketed(bucketed_);
        this->check_all_options();
        this->check_params();
        shards_.check_grads(this->name());
        sync_options();
      } catch (...) {
        overlap_error_ = std::current_exception();
      }
    }
    if (local_ && !overlap_error_) {
      // the wrapped optimizer steps the parameters whose grad is defined: the others' are hidden
      std::unordered_set<const TensorImpl*> in_bucket;
      for (const Tensor& p : bucket.parameters) in_bucket.insert(p.impl_ptr().get());
      std::vector<std::pair<Tensor, Tensor>> hidden;
      for (size_t g = 0; g < local_->num_param_groups(); ++g)
        for (const Tensor& p : local_->group_params(g))
          if (!in_bucket.count(p.impl_ptr().get()) && p.grad().defined()) hidden.emplace_back(p, p.grad());
      for (auto& [p, grad] : hidden) p.set_grad(Tensor());
      try {
        local_->step();
      } catch (...) {
        overlap_error_ = std::current_exception();
      }
      for (auto& [p, grad] : hidden) p.set_grad(grad);
    }
    shards_.start_broadcasts(bucket.parameters);
    if (!bucket.is_last) return;
    shards_.finish_broadcasts();
    ++steps_;
    shards_.agree(std::exchange(overlap_error_, nullptr), "step");
  }

  detail::ZeroShards shards_;
  std::unique_ptr<Opt> local_;
  std::optional<optim::StateDict> consolidated_;
  int64_t steps_ = 0, consolidated_at_ = 0;
  bool overlapping_ = false;
  std::unordered_set<const TensorImpl*> bucketed_;  // DDP's parameters, under overlap_with_ddp
  std::exception_ptr overlap_error_;                // this rank's, in the overlapped step in progress
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // held weakly by the bucket hook
};

}  // namespace strata::dist
