// The pipeline schedules over a process group's send and recv. A schedule is only its order of
// forwards and backwards (actions()); train_step runs any such order. An activation travels
// with a small int64 header (its rank, dims and dtype) as the next stage cannot know its shape;
// a gradient travels bare, as its receiver holds the activation it belongs to. Messages between
// two ranks keep their order (one tag), which NCCL's send/recv need as well as MPI's.
#include <strata/dist/pipeline.hpp>

#include <algorithm>
#include <utility>

#include <strata/autograd/autograd.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "dist/working_copy.h"

namespace strata::dist {

namespace {

constexpr int64_t kMaxDims = 8;

Device stage_device(nn::Module& stage) {
  auto params = stage.parameters();
  return params.empty() ? kCPU : params.front().device();
}

}  // namespace

PipelineSchedule::PipelineSchedule(std::vector<nn::Module*> stages, PipelineOptions options, const char* name,
                                   int gradient_tag)
    : group_(detail::group_or_default(options.process_group)), chunks_(options.chunks), name_(name),
      stages_(std::move(stages)), gradient_tag_(gradient_tag) {
  check_arguments(name_, stages_, chunks_);
  device_ = stage_device(*stages_.front());
}

void PipelineSchedule::check_arguments(const char* name, const std::vector<nn::Module*>& stages, int64_t chunks) {
  STRATA_CHECK(chunks > 0, "[{}] chunks must be positive, got {}", name, chunks);
  STRATA_CHECK(!stages.empty(), "[{}] this rank holds no stage", name);
  for (size_t c = 0; c < stages.size(); ++c) STRATA_CHECK(stages[c] != nullptr, "[{}] stage {} is null", name, c);
}

std::vector<Tensor> PipelineSchedule::split(const Tensor& t, const char* what) const {
  STRATA_CHECK(t.defined() && t.dim() > 0, "[{}] the {} must be a tensor with a batch dim on rank {}", name_, what,
               group_->rank());
  STRATA_CHECK(t.size(0) % chunks_ == 0, "[{}] the {} batch of {} does not split into {} micro-batches", name_, what,
               t.size(0), chunks_);
  return t.split(t.size(0) / chunks_, 0);
}

Tensor PipelineSchedule::receive_activation() {
  Tensor header = zeros({kMaxDims + 2}, TensorOptions(kInt64, device_));
  group_->recv(header, previous_rank())->wait();
  Tensor h = header.cpu();
  const int64_t* p = h.data_ptr<int64_t>();
  Shape shape(p + 2, p + 2 + p[0]);
  Tensor t = empty(shape, TensorOptions(static_cast<DType>(p[1]), device_));
  group_->recv(t, previous_rank())->wait();
  return t;
}

void PipelineSchedule::send_activation(const Tensor& out) {
  STRATA_CHECK(out.dim() <= kMaxDims, "[{}] a stage's output has {} dims; at most {} travel", name_, out.dim(),
               kMaxDims);
  std::vector<int64_t> header(kMaxDims + 2, 0);
  header[0] = out.dim();
  header[1] = static_cast<int64_t>(out.dtype());
  for (int64_t d = 0; d < out.dim(); ++d) header[static_cast<size_t>(d) + 2] = out.size(d);
  sends_.push_back(group_->send(from_vector(header).to(device_), next_rank()));
  sends_.push_back(group_->send(out.detach().contiguous(), next_rank()));
}

void PipelineSchedule::wait_sends() {
  for (auto& w : sends_) w->wait();
  sends_.clear();
}

Tensor PipelineSchedule::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  std::vector<Tensor> inputs, targets;
  if (is_first()) inputs = split(input, "input");
  if (is_last()) {
    targets = split(target, "target");
    STRATA_CHECK(loss_fn != nullptr, "[{}] the last stage needs a loss function", name_);
  }
  // the stage input and output of a (local stage, micro-batch) (and through them its graph) live
  // from its forward to its backward; slot c * chunks + m
  const size_t n = static_cast<size_t>(chunks_);
  std::vector<Tensor> xs(n * stages_.size()), outs(n * stages_.size()), losses(n);
  std::vector<Tensor> detached_losses(n);  // keep no graph
  int64_t in_flight = 0;
  max_in_flight_ = 0;
  Tensor held;  // an output whose send waits for the next backward's receive
  auto run_forward = [&](const Action& a) {
    const size_t m = static_cast<size_t>(a.micro_batch), slot = static_cast<size_t>(a.local_stage) * n + m;
    Tensor x = first_stage(a.local_stage) ? inputs[m] : receive_activation();
    if (!first_stage(a.local_stage) && is_floating(x.dtype())) x.requires_grad_();
    Tensor out = (*stages_[static_cast<size_t>(a.local_stage)])(x);
    if (last_stage(a.local_stage)) {
      Tensor loss = loss_fn(out, targets[m]);
      STRATA_CHECK(loss.numel() == 1, "[{}] the loss must have one element, got shape {}", name_, loss.shape());
      losses[m] = loss / static_cast<double>(chunks_);
      detached_losses[m] = losses[m].detach();
    } else if (a.send_after_next_receive) {
      held = out;
    } else {
      send_activation(out);
    }
    xs[slot] = x;
    outs[slot] = out;
    max_in_flight_ = std::max(max_in_flight_, ++in_flight);
  };
  auto run_backward = [&](const Action& a) {
    const size_t m = static_cast<size_t>(a.micro_batch), slot = static_cast<size_t>(a.local_stage) * n + m;
    if (last_stage(a.local_stage)) {
      losses[m].backward();
    } else {
      Tensor grad = empty(outs[slot].shape(), outs[slot].options());
      std::shared_ptr<Work> received = group_->recv(grad, next_rank(), gradient_tag_);
      if (held.defined()) send_activation(std::exchange(held, Tensor()));
      received->wait();
      outs[slot].backward(grad);
    }
    if (!first_stage(a.local_stage)) {
      const Tensor& x = xs[slot];
      Tensor g = x.requires_grad() && x.grad().defined() ? x.grad() : zeros_like(x);
      sends_.push_back(group_->send(g.contiguous(), previous_rank(), gradient_tag_));
    }
    xs[slot] = outs[slot] = Tensor();
    losses[m] = Tensor();
    --in_flight;
  };
  for (const Action& a : actions()) {
    if (a.forward) run_forward(a);
    else run_backward(a);
  }
  if (held.defined()) send_activation(held);  // a schedule that ends on such a forward (none does)
  wait_sends();
  Tensor total = zeros({1}, TensorOptions(kFloat64, device_));
  if (is_last()) {
    NoGradGuard no_grad;  // summed in micro-batch order, whatever the schedule
    for (const Tensor& l : detached_losses) total.add_(l.to(kFloat64).view({1}));
  }
  group_->broadcast(total, group_->size() - 1)->wait();
  return total.view({});
}

Tensor PipelineSchedule::forward(const Tensor& input) {
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, outputs;
  if (is_first()) inputs = split(input, "input");
  for (int64_t m = 0; m < chunks_; ++m) {
    for (int64_t c = 0; c < stages_per_rank(); ++c) {
      Tensor x = first_stage(c) ? inputs[static_cast<size_t>(m)] : receive_activation();
      Tensor out = (*stages_[static_cast<size_t>(c)])(x);
      if (last_stage(c)) outputs.push_back(out);
      else send_activation(out);
    }
  }
  wait_sends();
  return is_last() ? cat(outputs, 0) : Tensor();
}

GPipe::GPipe(nn::Module& stage, PipelineOptions options) : PipelineSchedule({&stage}, std::move(options), "GPipe") {}

std::vector<PipelineSchedule::Action> GPipe::actions() const {
  std::vector<Action> order;
  for (int64_t m = 0; m < chunks_; ++m) order.push_back({true, m});
  for (int64_t m = chunks_; m-- > 0;) order.push_back({false, m});
  return order;
}

Schedule1F1B::Schedule1F1B(nn::Module& stage, PipelineOptions options)
    : PipelineSchedule({&stage}, std::move(options), "Schedule1F1B") {}

// Megatron-LM's forward_backward_pipelining_without_interleaving: rank k's warm-up fills the
// pipeline below it (stages - k - 1 forwards), so its first backward arrives just as its next
// forward is done; each later forward then waits on one backward. In that steady state rank k
// would send an activation to k + 1 and then receive a gradient from it while k + 1 sends that
// gradient and then receives the activation: with sends that wait for their receive (NCCL's
// may for large messages, all on the group's one stream) both would wait forever. So, as Megatron's
// send_forward_recv_backward and torch's batched p2p do, the activation goes out once the
// gradient's receive is posted; k + 1 sends that gradient before it needs this activation.
std::vector<PipelineSchedule::Action> Schedule1F1B::actions() const {
  const int64_t warmup = std::min<int64_t>(group_->size() - group_->rank() - 1, chunks_);
  std::vector<Action> order;
  int64_t next_forward = 0, next_backward = 0;
  while (next_forward < warmup) order.push_back({true, next_forward++});
  while (next_forward < chunks_) {
    order.push_back({true, next_forward++, /*send_after_next_receive=*/true});
    order.push_back({false, next_backward++});
  }
  while (next_backward < chunks_) order.push_back({false, next_backward++});
  return order;
}

}  // namespace strata::dist
