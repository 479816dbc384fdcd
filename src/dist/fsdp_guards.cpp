// FullyShardedDataParallel's no_sync, summon_full_params and gradient clipping, each over this
// wrapper's units and those of the wrappers nested in its module tree.
#include <strata/dist/fsdp.hpp>

#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>
#include <strata/optim/clip.hpp>

#include "dist/fsdp_runtime.h"

namespace strata::dist {

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::FsdpRuntime> runtime) {
  for (auto& r : runtime->with_nested()) {
    previous_.emplace_back(r, r->sync);
    r->sync = false;
  }
}
FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() {
  for (auto& [r, previous] : previous_) r->sync = previous;
}
FullyShardedDataParallel::NoSyncGuard FullyShardedDataParallel::no_sync() { return NoSyncGuard(runtime_); }

FullyShardedDataParallel::FullParamsGuard::FullParamsGuard(std::shared_ptr<detail::FsdpRuntime> runtime,
                                                           bool writeback)
    : runtime_(std::move(runtime)), writeback_(writeback) {
  STRATA_CHECK(!runtime_->summoned, "[FullyShardedDataParallel] summon_full_params() is already active");
  // the nested wrappers first: should one raise, those entered are left again by their guards
  runtime_->with_nested();  // raises, before any collective, when a nested wrapper is gone
  for (const auto& inner : runtime_->nested)
    nested_.push_back(std::make_unique<FullParamsGuard>(inner.lock(), writeback));
  auto& units = runtime_->units();
  runtime_->gathered_before_summon.assign(units.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    runtime_->gathered_before_summon[u] = units[u].full.defined();
    runtime_->gather(u, /*master=*/true);  // under mixed precision, the shards' dtype
  }
  runtime_->cast_buffers(/*original=*/true);
  runtime_->summoned = true;
}

FullyShardedDataParallel::FullParamsGuard::~FullParamsGuard() {
  for (size_t u = 0; u < runtime_->units().size(); ++u) {
    if (writeback_) runtime_->write_back(u);
    runtime_->end_summon(u, runtime_->gathered_before_summon[u]);
  }
  runtime_->cast_buffers(/*original=*/false);
  runtime_->summoned = false;
}  // then the nested guards

FullyShardedDataParallel::FullParamsGuard FullyShardedDataParallel::summon_full_params(bool writeback) {
  return FullParamsGuard(runtime_, writeback);
}

// Each wrapper's part of the norm (sum |g|^p, or the max) combined over its own group when it
// shards (a NoShard wrapper's gradients are the same on every rank), then over the wrappers.
double FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  STRATA_CHECK(norm_type > 0, "[FullyShardedDataParallel] clip_grad_norm_: norm_type must be > 0 or inf, got {}",
               norm_type);
  STRATA_CHECK(max_norm >= 0, "[FullyShardedDataParallel] clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  const bool inf = std::isinf(norm_type);
  const auto wrappers = runtime_->with_nested();
  double combined = 0, total = 0;
  for (const auto& r : wrappers) {
    std::vector<Tensor> shards;
    for (const auto& unit : r->units()) shards.push_back(unit.shard);
    const double norm = optim::total_grad_norm(shards, norm_type);
    double part = inf ? norm : std::pow(norm, norm_type);
    total = norm;  // one wrapper, not sharded: its norm as it is
    if (r->sharded() && r->group().size() > 1) {  // every rank's shards, taken together
      Tensor t = full({1}, part, TensorOptions(kFloat64, r->units().front().device));  // the group's device
      r->group().allreduce(t, inf ? ReduceOp::Max : ReduceOp::Sum)->wait();
      part = t.cpu().item<double>();
    }
    combined = inf ? (std::isnan(part) || part > combined ? part : combined) : combined + part;
  }
  if (wrappers.size() > 1 || (runtime_->sharded() && runtime_->group().size() > 1))
    total = inf ? combined : std::pow(combined, 1.0 / norm_type);
  if (std::isinf(max_norm)) return total;
  const double coef = max_norm / (total + 1e-6);
  const double clamped = 1.0 < coef ? 1.0 : coef;  // NaN stays NaN, as optim::clip_grad_norm_
  NoGradGuard no_grad;
  if (clamped != 1.0)
    for (const Tensor& s : parameters())
      if (s.grad().defined()) s.grad().mul_(clamped);
  return total;
}

}  // namespace strata::dist
