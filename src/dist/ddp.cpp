// DistributedDataParallel: construction (model check, rank 0's state to every rank), the
// buffer broadcast before each forward, no_sync. The reduction itself is in reducer.cpp.
#include <strata/dist/ddp.hpp>

#include "dist/model_sync.h"
#include "dist/reducer.h"

#include <strata/autograd/grad_mode.hpp>

namespace strata::dist {

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DDPOptions options)
    : module_(module), options_(std::move(options)) {
  group_ = options_.process_group ? options_.process_group : default_group();
  STRATA_CHECK(options_.bucket_cap_mb > 0, "[DistributedDataParallel] bucket_cap_mb must be positive, got {}",
               options_.bucket_cap_mb);
  std::vector<Tensor> state = module_.parameters(), params;
  for (const Tensor& b : module_.buffers())
    if (b.defined()) state.push_back(b);
  detail::check_same_model(*group_, state, "DistributedDataParallel");
  for (const Tensor& p : module_.parameters())
    if (p.requires_grad()) params.push_back(p);
  {
    NoGradGuard no_grad;
    detail::broadcast_from_rank0(*group_, module_.parameters());
    detail::broadcast_from_rank0(*group_, module_.buffers());
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
    detail::broadcast_from_rank0(*group_, module_.buffers());
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

void DistributedDataParallel::set_comm_hook(CommHook hook) { reducer_->set_comm_hook(std::move(hook)); }

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const {
  return reducer_->bucket_params();
}

size_t DistributedDataParallel::buckets_started_during_backward() const {
  return reducer_->started_during_backward();
}

}  // namespace strata::dist
