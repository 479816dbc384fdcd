// DDP's gradient reducer: buckets, the per-parameter hooks that fill them, and the end-of-
// backward step that waits for them (Note [DDP buckets] in reducer.cpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <strata/dist/ddp.hpp>
#include <strata/dist/process_group.hpp>

namespace strata::dist::detail {

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  /// `params`: the parameters that require grad, in the module's order.
  Reducer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> group, int64_t bucket_cap_bytes,
          bool find_unused_parameters);
  /// Registers the gradient hooks; they hold the reducer weakly, so they do nothing once it is gone.
  void install_hooks();
  /// Forgets a backward pass that raised before its end (waiting for what it started).
  void reset();
  /// With find_unused_parameters: finds the parameters the graph of `outputs` does not reach,
  /// so the next backward counts them at its start and their buckets need not wait for its end.
  void prepare_for_backward(const std::vector<Tensor>& outputs);
  /// Forgets what the last prepare_for_backward found (a forward whose output it cannot walk).
  void forget_unused() { outside_graph_.clear(); }

  bool sync = true;  // false under no_sync()
  std::function<void(const GradBucket&)> bucket_hook;  // DistributedDataParallel::register_bucket_hook
  /// DistributedDataParallel::register_comm_hook: refused once set, or once a backward has run.
  void set_comm_hook(CommHook hook);
  const std::vector<std::vector<size_t>>& bucket_params() const { return bucket_params_; }
  size_t started_during_backward() const { return started_during_backward_; }

 private:
  struct Slot {
    size_t bucket;
    int64_t offset;  // in elements, within the bucket's flat buffer
  };
  void on_gradient(size_t param);
  void begin_backward();
  void absorb_missing(size_t param);  // a gradient that will not arrive: .grad's value, or zeros
  void start_ready_buckets();
  void finish_backward();
  Tensor slot_view(size_t param) const;
  GradBucket make_bucket(size_t b) const;
  /// Waits for bucket b's reduction and writes its value into the bucket's buffer.
  void take_result(size_t b);

  std::vector<Tensor> params_;
  std::shared_ptr<ProcessGroup> group_;
  bool find_unused_;
  CommHook comm_hook_;
  bool backward_seen_ = false;  // a gradient hook has run (no_sync passes count)
  std::vector<std::vector<size_t>> bucket_params_;  // parameter indices per bucket
  std::vector<Tensor> flat_;                        // one contiguous buffer per bucket
  std::vector<Slot> slots_;                         // per parameter
  // state of the backward pass in progress
  bool in_backward_ = false;
  // Held only by the callback queued for the pass in progress: the engine drops the callback
  // unrun when the backward raises, so an expired pass_alive_ marks that pass as abandoned.
  std::weak_ptr<void> pass_alive_;
  std::vector<bool> ready_;
  std::vector<bool> got_gradient_;    // from its hook, in this pass
  std::vector<bool> outside_graph_;   // found by prepare_for_backward
  std::vector<size_t> pending_;  // per bucket: gradients not yet in
  std::vector<CommFuture> futures_;  // per bucket: its reduced buffer
  size_t next_bucket_ = 0;  // buckets start in order, the same on every rank
  size_t started_during_backward_ = 0;
};

}  // namespace strata::dist::detail
