// DistributedDataParallel: data-parallel training with PyTorch's DDP semantics. Each rank runs
// the same model on its own part of the batch; the gradients are averaged over the ranks during
// the backward pass, so every rank's optimizer takes the same step.
//
//   dist::init_process_group("mpi");
//   Net net;
//   dist::DistributedDataParallel ddp(net);       // rank 0's parameters and buffers everywhere
//   optim::SGD opt(net.parameters(), {.lr = 0.1});
//   for (...) {
//     Tensor loss = nn::functional::cross_entropy(ddp(x_local), y_local);
//     loss.backward();                              // .grad holds the mean over ranks on return
//     opt.step();
//     opt.zero_grad();
//   }
//
// How (Note [DDP buckets] in src/dist/reducer.cpp): parameters are grouped, in reverse order
// (roughly the order their gradients become ready), into buckets of at most bucket_cap_mb; a
// post-accumulate-grad hook copies each gradient into its bucket, and a bucket whose gradients
// are all in starts its allreduce at once, on the communication thread, while the backward
// goes on. A callback queued on the engine waits for every bucket and writes the averages into
// .grad before backward() returns. A communication hook (register_comm_hook; ddp_comm_hooks.hpp:
// half-precision compression, PowerSGD) replaces each bucket's allreduce.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include <strata/dist/comm_hook.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

namespace detail {
class Reducer;
}

struct DDPOptions {
  /// The group to train over; the default group when null.
  std::shared_ptr<ProcessGroup> process_group = nullptr;
  /// Largest bucket, in MiB (a parameter larger than this gets a bucket of its own).
  double bucket_cap_mb = 25;
  /// Copy rank 0's buffers (BatchNorm's running statistics) to every rank before each forward.
  bool broadcast_buffers = true;
  /// Each forward walks its output's graph for the parameters it does not reach, which the
  /// backward then counts at its start, so their buckets need not wait for its end; a parameter
  /// that got no gradient on any rank keeps its .grad untouched (one more small allreduce per
  /// step decides which). Without it such a parameter's .grad becomes zeros. A parameter unused
  /// on some ranks only is handled either way: those ranks count zeros.
  bool find_unused_parameters = false;
};

/// Wraps a module (not owned: it must outlive the wrapper) for data-parallel training.
/// Construction is collective: every rank must construct it, with the same model.
class STRATA_API DistributedDataParallel {
 public:
  explicit DistributedDataParallel(nn::Module& module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Broadcasts the buffers (broadcast_buffers) and runs the module's forward.
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  /// The same for a forward of any other signature: `fn` calls the module and returns its
  /// output (a Tensor, or anything else: then find_unused_parameters finds nothing early).
  template <class F> auto forward_with(F&& fn) {
    before_forward();
    auto out = std::forward<F>(fn)();
    if constexpr (std::is_same_v<decltype(out), Tensor>) after_forward(out);
    return out;
  }

  nn::Module& module() { return module_; }
  std::vector<Tensor> parameters() const { return module_.parameters(); }
  std::shared_ptr<ProcessGroup> process_group() const { return group_; }
  DistributedDataParallel& train(bool on = true);
  DistributedDataParallel& eval() { return train(false); }

  /// While the guard lives, backward passes only accumulate local gradients (no
  /// communication); the first backward after it averages the accumulated sum (gradient
  /// accumulation, torch's `with ddp.no_sync():`).
  class STRATA_API NoSyncGuard {
   public:
    explicit NoSyncGuard(std::shared_ptr<detail::Reducer> reducer);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    std::shared_ptr<detail::Reducer> reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync();

  /// Runs `hook` for each bucket, in index order, at the end of every synchronized backward, as
  /// soon as that bucket's averages are in .grad, while the later buckets' allreduces may still
  /// be in flight (ZeroRedundancyOptimizer::overlap_with_ddp steps from it). One hook at a time;
  /// null removes it. A hook that raises raises from backward() once every bucket is written.
  void register_bucket_hook(std::function<void(const GradBucket&)> hook);

  /// Replaces the bucket's allreduce (torch's register_comm_hook): for each bucket, once its
  /// local gradients are in bucket.buffer, DDP calls `hook(*state, bucket)` and writes the value
  /// of the future it returns (a tensor of buffer's size) into the parameters' .grad at the end
  /// of the backward. Built-in hooks: dist::ddp_comm_hooks. A null `state` (the literal nullptr)
  /// passes this DDP's process group. Once only, before the first backward; every rank alike.
  template <class State, class Hook> void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    static_assert(std::is_invocable_r_v<CommFuture, Hook&, State&, GradBucket&>,
                  "a communication hook is called as hook(State&, GradBucket&) and returns a CommFuture");
    STRATA_CHECK(state != nullptr, "[DistributedDataParallel::register_comm_hook] the state is null (pass the "
                                   "literal nullptr for this DDP's process group)");
    if constexpr (std::is_constructible_v<bool, Hook&>)
      STRATA_CHECK(static_cast<bool>(hook), "[DistributedDataParallel::register_comm_hook] the hook is empty");
    set_comm_hook([state = std::move(state), hook = std::move(hook)](GradBucket& b) mutable {
      return CommFuture(hook(*state, b));
    });
  }
  template <class Hook> void register_comm_hook(std::nullptr_t, Hook hook) {
    register_comm_hook(group_, std::move(hook));
  }

  /// The buckets, as indices into parameters() (those that require grad), in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  /// How many buckets the last synchronized backward started from gradient hooks, before the
  /// pass ended (the rest started at its end: buckets holding unused parameters).
  size_t buckets_started_during_backward() const;

 private:
  void set_comm_hook(CommHook hook);
  void before_forward();
  void after_forward(const Tensor& output);

  nn::Module& module_;
  DDPOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<detail::Reducer> reducer_;
};

}  // namespace strata::dist
