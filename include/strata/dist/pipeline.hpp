// Pipeline parallelism with GPipe's schedule: the model is cut into stages, one per rank of the
// group in rank order; a batch is split into micro-batches that flow forward through the stages
// (activations sent with send/recv), then backward in reverse order (gradients of the
// activations sent back), so the stages work on different micro-batches at once. The stages'
// gradients accumulate as for the whole batch; the optimizer step stays with the caller.
//
//   dist::GPipe pipe(my_stage, {.chunks = 8});                // my_stage: this rank's layers
//   Tensor loss = pipe.train_step(x, y, [](const Tensor& out, const Tensor& t) {
//     return nn::functional::cross_entropy(out, t);
//   });                                                        // the same loss on every rank
//   opt.step();  opt.zero_grad();
#pragma once

#include <functional>
#include <memory>

#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

struct GPipeOptions {
  /// Micro-batches per step; the batch (dim 0) must split into this many equal parts.
  int64_t chunks = 4;
  std::shared_ptr<ProcessGroup> process_group = nullptr;  // the default group when null
};

class STRATA_API GPipe {
 public:
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  /// `stage`: this rank's part of the model (not owned). Rank 0 takes the input, the last rank's
  /// output goes to the loss.
  explicit GPipe(nn::Module& stage, GPipeOptions options = {});

  /// One step's forward and backward over the micro-batches. `input` is read on rank 0 only,
  /// `target` and `loss_fn` on the last rank only (other ranks may pass undefined tensors). The
  /// loss of each micro-batch is divided by `chunks`, so the gradients are those of the mean of
  /// the micro-batch losses (the batch's loss for a mean loss). Returns that mean, detached, on
  /// every rank.
  Tensor train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn);
  /// The forward alone (no graph kept), micro-batch by micro-batch: the last rank's outputs
  /// concatenated on the last rank, undefined elsewhere.
  Tensor forward(const Tensor& input);

  bool is_first() const { return group_->rank() == 0; }
  bool is_last() const { return group_->rank() == group_->size() - 1; }

 private:
  Tensor receive_activation();
  void send_activation(const Tensor& out);
  std::vector<Tensor> split(const Tensor& t, const char* what) const;

  nn::Module& stage_;
  int64_t chunks_;
  std::shared_ptr<ProcessGroup> group_;
  Device device_;
  std::vector<std::shared_ptr<Work>> sends_;  // in flight until the step ends
};

}  // namespace strata::dist
