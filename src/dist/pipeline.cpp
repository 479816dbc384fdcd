// GPipe's schedule over a process group's send and recv: all micro-batches forward, then all
// backward in reverse order. An activation travels with a small int64 header (its rank, dims
// and dtype) as the next stage cannot know its shape; a gradient travels bare, as its receiver
// holds the activation it belongs to. Messages between two ranks keep their order (one tag),
// which NCCL's send/recv need as well as MPI's.
#include <strata/dist/pipeline.hpp>

#include <strata/autograd/autograd.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

namespace strata::dist {

namespace {

constexpr int64_t kMaxDims = 8;

Device stage_device(nn::Module& stage) {
  auto params = stage.parameters();
  return params.empty() ? kCPU : params.front().device();
}

}  // namespace

GPipe::GPipe(nn::Module& stage, GPipeOptions options)
    : stage_(stage), chunks_(options.chunks),
      group_(options.process_group ? options.process_group : default_group()), device_(stage_device(stage)) {
  STRATA_CHECK(chunks_ > 0, "[GPipe] chunks must be positive, got {}", chunks_);
}

std::vector<Tensor> GPipe::split(const Tensor& t, const char* what) const {
  STRATA_CHECK(t.defined() && t.dim() > 0, "[GPipe] the {} must be a tensor with a batch dim on rank {}", what,
               group_->rank());
  STRATA_CHECK(t.size(0) % chunks_ == 0, "[GPipe] the {} batch of {} does not split into {} micro-batches", what,
               t.size(0), chunks_);
  return t.split(t.size(0) / chunks_, 0);
}

Tensor GPipe::receive_activation() {
  Tensor header = zeros({kMaxDims + 2}, TensorOptions(kInt64, device_));
  group_->recv(header, group_->rank() - 1)->wait();
  Tensor h = header.cpu();
  const int64_t* p = h.data_ptr<int64_t>();
  Shape shape(p + 2, p + 2 + p[0]);
  Tensor t = empty(shape, TensorOptions(static_cast<DType>(p[1]), device_));
  group_->recv(t, group_->rank() - 1)->wait();
  return t;
}

void GPipe::send_activation(const Tensor& out) {
  STRATA_CHECK(out.dim() <= kMaxDims, "[GPipe] a stage's output has {} dims; at most {} travel", out.dim(), kMaxDims);
  std::vector<int64_t> header(kMaxDims + 2, 0);
  header[0] = out.dim();
  header[1] = static_cast<int64_t>(out.dtype());
  for (int64_t d = 0; d < out.dim(); ++d) header[static_cast<size_t>(d) + 2] = out.size(d);
  sends_.push_back(group_->send(from_vector(header).to(device_), group_->rank() + 1));
  sends_.push_back(group_->send(out.detach().contiguous(), group_->rank() + 1));
}

Tensor GPipe::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  const int rank = group_->rank();
  std::vector<Tensor> inputs, targets;
  if (is_first()) inputs = split(input, "input");
  if (is_last()) {
    targets = split(target, "target");
    STRATA_CHECK(loss_fn != nullptr, "[GPipe] the last stage needs a loss function");
  }
  std::vector<Tensor> xs(static_cast<size_t>(chunks_)), outs(xs.size()), losses(xs.size());
  for (size_t m = 0; m < xs.size(); ++m) {
    Tensor x = is_first() ? inputs[m] : receive_activation();
    if (!is_first() && is_floating(x.dtype())) x.requires_grad_();
    Tensor out = stage_(x);
    if (is_last()) {
      Tensor loss = loss_fn(out, targets[m]);
      STRATA_CHECK(loss.numel() == 1, "[GPipe] the loss must have one element, got shape {}", loss.shape());
      losses[m] = loss / static_cast<double>(chunks_);
    } else {
      send_activation(out);
    }
    xs[m] = x;
    outs[m] = out;
  }
  for (size_t m = xs.size(); m-- > 0;) {
    if (is_last()) {
      losses[m].backward();
    } else {
      Tensor grad = empty(outs[m].shape(), outs[m].options());
      group_->recv(grad, rank + 1)->wait();
      outs[m].backward(grad);
    }
    if (!is_first()) {
      Tensor g = xs[m].requires_grad() && xs[m].grad().defined() ? xs[m].grad() : zeros_like(xs[m]);
      sends_.push_back(group_->send(g.contiguous(), rank - 1));
    }
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  Tensor total = zeros({1}, TensorOptions(kFloat64, device_));
  if (is_last()) {
    NoGradGuard no_grad;
    for (const Tensor& l : losses) total.add_(l.detach().to(kFloat64).view({1}));
  }
  group_->broadcast(total, group_->size() - 1)->wait();
  return total.view({});
}

Tensor GPipe::forward(const Tensor& input) {
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, outputs;
  if (is_first()) inputs = split(input, "input");
  for (int64_t m = 0; m < chunks_; ++m) {
    Tensor x = is_first() ? inputs[static_cast<size_t>(m)] : receive_activation();
    Tensor out = stage_(x);
    if (is_last()) {
      outputs.push_back(out);
      continue;
    }
    send_activation(out);
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  return is_last() ? cat(outputs, 0) : Tensor();
}

}  // namespace strata::dist
