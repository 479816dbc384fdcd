// Pipeline parallelism: the model is cut into stages, one per rank of the group in rank order; a
// batch is split into micro-batches that flow forward through the stages (activations sent with
// send/recv) and backward in reverse (gradients of the activations sent back), so the stages work
// on different micro-batches at once. The stages' gradients accumulate as for the whole batch; the
// optimizer step stays with the caller. Three schedules, with one contract:
//  - GPipe: every micro-batch forward, then every one backward: each rank holds the activations
//    of all `chunks` micro-batches at the peak.
//  - Schedule1F1B (PipeDream-Flush, Megatron-LM's non-interleaved schedule): rank k runs
//    stages - k - 1 warm-up forwards, then alternates one forward and one backward, then the
//    remaining backwards, so it holds at most stages - k micro-batches' activations, whatever
//    `chunks` is; the idle time (bubble) is GPipe's.
//  - ScheduleInterleaved1F1B (Megatron-LM's virtual pipeline stages): each rank holds several
//    model chunks, stage s on rank s % ranks, and runs 1F1B over them: the bubble shrinks by the
//    number of chunks per rank, for more messages and a few more micro-batches in flight.
//
//   dist::Schedule1F1B pipe(my_stage, {.chunks = 8});         // my_stage: this rank's layers
//   Tensor loss = pipe.train_step(x, y, [](const Tensor& out, const Tensor& t) {
//     return nn::functional::cross_entropy(out, t);
//   });                                                        // the same loss on every rank
//   opt.step();  opt.zero_grad();
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

struct PipelineOptions {
  /// Micro-batches per step; the batch (dim 0) must split into this many equal parts.
  int64_t chunks = 4;
  std::shared_ptr<ProcessGroup> process_group = nullptr;  // the default group when null
};
using GPipeOptions = PipelineOptions;

/// What the schedules share: the stage, the micro-batches, the activations' and gradients' travel,
/// and the step that runs a schedule's order of forwards and backwards.
class STRATA_API PipelineSchedule {
 public:
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  virtual ~PipelineSchedule() = default;

  /// One step's forward and backward over the micro-batches. `input` is read on rank 0 only,
  /// `target` and `loss_fn` on the last rank only (other ranks may pass undefined tensors). The
  /// loss of each micro-batch is divided by `chunks`, so the gradients are those of the mean of
  /// the micro-batch losses (the batch's loss for a mean loss). Returns that mean, detached, on
  /// every rank.
  Tensor train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn);
  /// The forward alone (no graph kept), micro-batch by micro-batch: the last rank's outputs
  /// concatenated on the last rank, undefined elsewhere.
  Tensor forward(const Tensor& input);

  /// Whether this rank holds the first stage (it reads the input) and the last (it takes the loss).
  bool is_first() const { return group_->rank() == 0; }
  bool is_last() const { return group_->rank() == group_->size() - 1; }
  int64_t chunks() const { return chunks_; }
  /// The model's stages over all ranks, and this rank's (one but under the interleaved schedule).
  int64_t num_stages() const { return group_->size() * stages_per_rank(); }
  int64_t stages_per_rank() const { return static_cast<int64_t>(stages_.size()); }
  /// The most activations (stage input, output and autograd graph of one micro-batch through one
  /// of this rank's stages) this rank held at once during the last train_step: `chunks` under
  /// GPipe, at most stages - rank under 1F1B (see ScheduleInterleaved1F1B for its bound). They are
  /// released as soon as their backward has run.
  int64_t max_in_flight() const { return max_in_flight_; }

 protected:
  /// One unit of a rank's work: micro-batch `micro_batch`'s forward or backward through this
  /// rank's stage `local_stage` (global stage local_stage * ranks + rank).
  struct Action {
    bool forward;
    int64_t micro_batch;
    /// A forward only: its output goes to the next stage once the following backward has posted
    /// the receive of its gradient, not at once (1F1B's steady state, see Schedule1F1B::actions).
    bool send_after_next_receive = false;
    int64_t local_stage = 0;
  };
  /// `gradient_tag`: the tag gradients travel with (activations use 0); a schedule whose two
  /// neighbours exchange both in one direction needs them apart.
  PipelineSchedule(std::vector<nn::Module*> stages, PipelineOptions options, const char* name,
                   int gradient_tag = 0);
  /// Raises (on this rank) unless `chunks` is positive and `stages` are some, none null.
  static void check_arguments(const char* name, const std::vector<nn::Module*>& stages, int64_t chunks);
  /// This rank's forwards and backwards, in order: every (stage, micro-batch) once each, its
  /// forward first, in an order that lets the ranks' blocking receives meet.
  virtual std::vector<Action> actions() const = 0;

  std::shared_ptr<ProcessGroup> group_;
  int64_t chunks_;
  const char* name_;

 private:
  Tensor receive_activation();
  void send_activation(const Tensor& out);
  std::vector<Tensor> split(const Tensor& t, const char* what) const;
  void wait_sends();
  bool first_stage(int64_t local_stage) const { return local_stage == 0 && is_first(); }
  bool last_stage(int64_t local_stage) const { return local_stage == stages_per_rank() - 1 && is_last(); }
  int previous_rank() const { return (group_->rank() + group_->size() - 1) % group_->size(); }
  int next_rank() const { return (group_->rank() + 1) % group_->size(); }

  std::vector<nn::Module*> stages_;
  int gradient_tag_;
  Device device_;
  std::vector<std::shared_ptr<Work>> sends_;  // in flight until the step ends
  int64_t max_in_flight_ = 0;
};

/// GPipe's schedule: all forwards, then all backwards in reverse order.
class STRATA_API GPipe : public PipelineSchedule {
 public:
  /// `stage`: this rank's part of the model (not owned). Rank 0 takes the input, the last rank's
  /// output goes to the loss.
  explicit GPipe(nn::Module& stage, PipelineOptions options = {});

 protected:
  std::vector<Action> actions() const override;
};

/// The 1F1B schedule (torch.distributed.pipelining's Schedule1F1B): warm-up forwards, one forward
/// and one backward in turn, cool-down backwards; micro-batches go backward in forward order.
class STRATA_API Schedule1F1B : public PipelineSchedule {
 public:
  explicit Schedule1F1B(nn::Module& stage, PipelineOptions options = {});

 protected:
  std::vector<Action> actions() const override;
};

/// The interleaved 1F1B schedule (Megatron-LM's virtual pipeline stages, torch's
/// ScheduleInterleaved1F1B): this rank holds `stages.size()` model chunks, its stage c being the
/// model's stage c * ranks + rank, so a micro-batch goes round the ranks that many times. With v
/// stages per rank the bubble is 1/v of 1F1B's; rank k holds at most
/// min(v * chunks, (v - 1) * ranks + 2 * (ranks - k - 1) + 1) activations at once.
/// `chunks` must be a multiple of the number of ranks (Megatron's rule: micro-batches go through
/// each stage in groups of one per rank). Needs at least 2 ranks and a backend whose sends do not
/// wait for their receive (MPI; not NCCL, whose sends would need grouping).
class STRATA_API ScheduleInterleaved1F1B : public PipelineSchedule {
 public:
  /// `stages`: this rank's model chunks in model order (not owned; every rank the same number).
  /// Collective: the ranks' numbers of stages and micro-batches are compared, and every rank
  /// raises when they differ or when any rank's arguments are wrong.
  explicit ScheduleInterleaved1F1B(std::vector<nn::Module*> stages, PipelineOptions options = {});

 protected:
  std::vector<Action> actions() const override;

 private:
  static std::vector<nn::Module*> agreed_stages(std::vector<nn::Module*> stages, const PipelineOptions& options);
};

}  // namespace strata::dist
