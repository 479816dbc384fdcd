// DistributedDataParallel: construction (model check, rank 0's state to every rank), the
// buffer broadcast before each forward, no_sync. The reduction itself is in reducer.cpp.
#include <strata/dist/ddp.hpp>

#include "dist/reducer.h"

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist {

namespace {

// Broadcasts every tensor from rank 0, all in flight at once.
void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors) {
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& t : tensors)
    if (t.defined()) works.push_back(group.broadcast(t.detach(), 0));
  for (auto& w : works) w->wait();
}

// Every rank must wrap the same model: compares the count and shapes of the parameters and
// buffers (all of them: frozen ones are broadcast too, and a broadcast of mismatched sizes fails
// or hangs) across ranks (their sizes, weighted by position, summed) and raises on every rank
// together when they differ.
void check_same_model(ProcessGroup& group, const std::vector<Tensor>& params) {
  int64_t count = static_cast<int64_t>(params.size()), total = 0, weighted = 0, dims = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    total += params[k].numel();
    weighted += static_cast<int64_t>(k + 1) * params[k].numel();
    for (int64_t d = 0; d < params[k].dim(); ++d) dims += (d + 1) * params[k].size(d);
  }
  const std::vector<int64_t> mine{count, total, weighted, dims};
  Tensor hi = from_vector(mine), lo = from_vector(mine);
  if (!params.empty() && params.front().is_cuda()) {
    hi = hi.to(params.front().device());
    lo = lo.to(params.front().device());
  }
  auto w1 = group.allreduce(hi, ReduceOp::Max);
  auto w2 = group.allreduce(lo, ReduceOp::Min);
  w1->wait();
  w2->wait();
  STRATA_CHECK(equal(hi, lo),
               "[DistributedDataParallel] the ranks wrap different models: this rank has {} parameters and "
               "buffers of {} elements in all; every rank must construct the same model",
               count, total);
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DDPOptions options)
    : module_(module), options_(std::move(options)) {
  group_ = options_.process_group ? options_.process_group : default_group();
  STRATA_CHECK(options_.bucket_cap_mb > 0, "[DistributedDataParallel] bucket_cap_mb must be positive, got {}",
               options_.bucket_cap_mb);
  std::vector<Tensor> state = module_.parameters(), params;
  for (const Tensor& b : module_.buffers())
    if (b.defined()) state.push_back(b);
  check_same_model(*group_, state);
  for (const Tensor& p : module_.parameters())
    if (p.requires_grad()) params.push_back(p);
  {
    NoGradGuard no_grad;
    broadcast_from_rank0(*group_, module_.parameters());
    broadcast_from_rank0(*group_, module_.buffers());
  }
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * 1024.0 * 1024.0);
  reducer_ = std::make_shared<detail::Reducer>(params, group_, std::max<int64_t>(cap, 1),
                                               options_.find_unused_parameters);
  reducer_->install_hooks();
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::before_forward() {
  reducer_->reset();
  reducer_->forget_unused();  // found again by after_forward, for a Tensor output only
  if (options_.broadcast_buffers && group_->size() > 1) {
    NoGradGuard no_grad;
    broadcast_from_rank0(*group_, module_.buffers());
  }
}

void DistributedDataParallel::after_forward(const Tensor& output) { reducer_->prepare_for_backward({output}); }

Tensor DistributedDataParallel::forward(const Tensor& input) {
  return forward_with([&] { return module_(input); });
}

DistributedDataParallel& DistributedDataParallel::train(bool on) {
  module_.train(on);
  return *this;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::Reducer> reducer)
    : reducer_(std::move(reducer)), previous_(reducer_->sync) {
  reducer_->sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { reducer_->sync = previous_; }

DistributedDataParallel::NoSyncGuard DistributedDataParallel::no_sync() { return NoSyncGuard(reducer_); }

void DistributedDataParallel::register_bucket_hook(std::function<void(const GradBucket&)> hook) {
  reducer_->bucket_hook = std::move(hook);
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const {
  return reducer_->bucket_params();
}

size_t DistributedDataParallel::buckets_started_during_backward() const {
  return reducer_->started_during_backward();
}

}  // namespace strata::dist
