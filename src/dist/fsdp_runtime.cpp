// FullyShardedDataParallel's forward and backward steps.
//
// Note [FSDP units]: each unit's parameters stay the module's own leaf tensors (the handles its
// layers keep), and FSDP only changes what they point at (Tensor::set_data): the parts of the
// gathered flat parameter while the unit is gathered, a 0-element tensor while it is freed. So
// autograd accumulates a full gradient into each parameter's .grad as for a plain module, and a
// post-accumulate hook counts them. When a unit's gradients are all in (those of the parameters
// the forward's graph reached: trace_used), they are flattened into
// one padded buffer (the parameters' .grad dropped), the unit is freed under FullShard, and its
// reduction (reduce_scatter with Avg into this rank's part; allreduce under NoShard) starts, in
// the fixed order last unit first, a unit that is ready waiting for those before it, so every
// rank issues the same collectives in the same order whatever order its hooks fire in. The
// forward's pre-hook gathers a unit and its forward hook frees it (FullShard, or any strategy
// without grad mode) and hooks the outputs' gradients, which gather it again at the start of its
// backward. While FullyShardedDataParallel::forward runs, saved-tensor hooks keep a tensor that
// aliases a gathered flat parameter as its place in it, not its memory, so the freed memory is
// really released and the backward rebuilds the tensor from the gathered parameter again
// (gathering it if nothing has yet). A callback queued at the start of the backward counts the
// gradients that never arrived (unused parameters: their .grad as it is, or zeros, as DDP),
// waits for every reduction, adds each rank's part to its shard's .grad, and frees the
// ShardGradOp units. Under MixedPrecision the shard (the master) is cast to param_dtype before it
// is gathered, the flat gradient is built and reduced in reduce_dtype, and the reduced part is
// cast back to the shard's dtype as it is added to its .grad.
#include "dist/fsdp_runtime.h"

#include <algorithm>

#include <strata/autograd/autograd.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "dist/model_sync.h"

namespace strata::dist::detail {

namespace {

// A saved tensor that aliases unit `unit`'s gathered flat parameter, by its place in it.
struct PackedParam {
  std::weak_ptr<FsdpRuntime> owner;  // this wrapper's runtime or a nested one's
  size_t unit;
  int64_t offset;
  Shape shape;
  Strides strides;
};

}  // namespace

FsdpRuntime::FsdpRuntime(nn::Module& root, std::shared_ptr<ProcessGroup> group, std::shared_ptr<ProcessGroup> replicate,
                         const FSDPOptions& options, std::vector<FlatUnit> units)
    : root_(root),
      group_(std::move(group)),
      replicate_(std::move(replicate)),
      strategy_(options.sharding_strategy),
      backward_prefetch_(options.backward_prefetch),
      forward_prefetch_(options.forward_prefetch),
      offload_params_(options.cpu_offload.offload_params),
      units_(std::move(units)),
      mixed_precision_(options.mixed_precision) {}

void FsdpRuntime::agree_on_error(std::exception_ptr error, const char* what) const {
  const Device device = units_.front().device;
  if (!replicate_) return detail::agree_on_error(*group_, error, device, "FullyShardedDataParallel", what);
  Tensor failed = full({1}, error ? 1 : 0, TensorOptions(kInt32, device));
  group_->allreduce(failed, ReduceOp::Max)->wait();  // then to every shard group through the replicas
  replicate_->allreduce(failed, ReduceOp::Max)->wait();
  if (error) std::rethrow_exception(error);
  STRATA_CHECK(failed.cpu().item<int32_t>() == 0,
               "[FullyShardedDataParallel] {} failed on another rank (its error names the cause)", what);
}

void FsdpRuntime::install() {
  NoGradGuard no_grad;
  const int64_t shards = shard_count(), rank = sharded() ? group_->rank() : 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatUnit& unit = units_[u];
    std::vector<Tensor> parts;
    for (const Tensor& p : unit.params) parts.push_back(p.detach().reshape({-1}));
    const TensorOptions options = unit.params.front().options();
    if (unit.padded > unit.numel) parts.push_back(zeros({unit.padded - unit.numel}, options));
    const int64_t length = unit.padded / shards;
    unit.shard = cat(parts, 0).narrow(0, rank * length, length).clone();
    if (offload_params_) unit.shard = unit.shard.to(kCPU);
    if (unit.requires_grad) unit.shard.requires_grad_(true);
    for (const Tensor& p : unit.params) p.set_data(empty({0}, options));
    unit.used.assign(unit.params.size(), false);
    unit.awaited.assign(unit.params.size(), false);
    for (size_t k = 0; k < unit.params.size(); ++k) param_at_[unit.params[k].impl_ptr().get()] = {u, k};
    if (!sharded()) gather(u);  // NoShard: the parameters are views of the shard, for good
  }
  std::weak_ptr<FsdpRuntime> weak = weak_from_this();
  for (size_t u = 0; u < units_.size(); ++u) {
    nn::Module& m = *units_[u].module;
    handles_.push_back(m.register_forward_pre_hook([weak, u](nn::Module&, const Tensor&) {
      if (auto self = weak.lock()) self->pre_forward(u);
    }));
    handles_.push_back(m.register_forward_hook(
        [weak, u](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& outputs) {
          if (auto self = weak.lock()) self->post_forward(u, outputs);
        },
        false, /*always_call=*/true));
    for (size_t k = 0; k < units_[u].params.size(); ++k)
      if (units_[u].requires_grad)
        units_[u].params[k].register_post_accumulate_grad_hook([weak, u, k](const Tensor&) {
          if (auto self = weak.lock()) self->on_gradient(u, k);
        });
  }
}

void FsdpRuntime::uninstall() {
  for (auto& h : handles_) h.remove();
  handles_.clear();
}

void FsdpRuntime::cast_buffers(bool original) {
  if (!mixed_precision_.buffer_dtype) return;
  NoGradGuard no_grad;
  for (const Tensor& b : root_.buffers()) {
    if (!b.defined() || !is_floating(b.dtype())) continue;
    const auto it = buffer_dtypes_.find(b.storage().get());
    const DType own = it == buffer_dtypes_.end() ? b.dtype() : it->second;
    if (it != buffer_dtypes_.end()) buffer_dtypes_.erase(it);
    const DType target = original ? own : *mixed_precision_.buffer_dtype;
    if (b.dtype() != target) b.set_data(b.to(target));
    if (target != own) buffer_dtypes_[b.storage().get()] = own;
  }
}

Tensor FsdpRuntime::original_buffer(const Tensor& buffer) const {
  if (!buffer.defined()) return buffer;
  const auto it = buffer_dtypes_.find(buffer.storage().get());
  return it == buffer_dtypes_.end() ? buffer : buffer.to(it->second);
}

std::any FsdpRuntime::pack(const Tensor& t) {
  if (!t.defined()) return t;
  if (auto it = gathered_.find(t.storage().get()); it != gathered_.end())
    return PackedParam{weak_from_this(), it->second, t.storage_offset(), t.shape(), t.strides()};
  for (const auto& weak : nested)  // a nested wrapper's parameters, released and re-gathered alike
    if (auto inner = weak.lock()) {
      std::any packed = inner->pack(t);
      if (!std::any_cast<Tensor>(&packed)) return packed;
    }
  return t;
}

Tensor FsdpRuntime::unpack(const std::any& packed) {
  if (const auto* p = std::any_cast<PackedParam>(&packed)) {
    auto owner = p->owner.lock();
    STRATA_CHECK(owner != nullptr, "[FullyShardedDataParallel] the backward needs a nested wrapper's parameters, "
                 "but that wrapper is gone; keep it alive until the backward has run");
    owner->gather(p->unit);
    return owner->units_[p->unit].full.as_strided(p->shape, p->strides, p->offset);
  }
  return std::any_cast<Tensor>(packed);
}

std::vector<std::shared_ptr<FsdpRuntime>> FsdpRuntime::with_nested() {
  std::vector<std::shared_ptr<FsdpRuntime>> all{shared_from_this()};
  for (const auto& weak : nested) {
    auto inner = weak.lock();
    STRATA_CHECK(inner != nullptr, "[FullyShardedDataParallel] a wrapper nested in this one was destroyed first; "
                 "nested wrappers must outlive the wrapper around them");
    for (auto& r : inner->with_nested()) all.push_back(std::move(r));
  }
  return all;
}

void FsdpRuntime::pre_forward(size_t u) {
  STRATA_CHECK(!summoned, "[FullyShardedDataParallel] unit '{}' was called inside summon_full_params(); run the "
               "forward outside it", units_[u].name);
  if (units_[u].name.empty()) begin_forward_pass();  // the root called directly, not through the wrapper
  gather(u);
  if (in_backward_ || units_[u].forwarded) return;  // a recomputation, or a unit called twice
  units_[u].forwarded = true;
  forward_order_.push_back(u);
  prefetch_after_forward_of(u);
}

void FsdpRuntime::post_forward(size_t u, const std::vector<Tensor>& outputs) {
  const bool grad_mode = autograd::is_grad_enabled();
  std::weak_ptr<FsdpRuntime> weak = weak_from_this();
  if (grad_mode && !in_backward_) trace_used(outputs);  // not a recomputation inside the backward
  auto& ended = post_forward_order_;
  if (!in_backward_ && std::find(ended.begin(), ended.end(), u) == ended.end()) ended.push_back(u);
  if (grad_mode)
    for (const Tensor& out : outputs)
      if (out.defined() && out.requires_grad() && !out.is_leaf()) {
        units_[u].needs_backward = true;
        out.register_hook([weak, u](const Tensor&) {
          if (auto self = weak.lock()) self->pre_backward(u);
          return Tensor();
        });
      }
  // ShardGradOp keeps a unit whole for the backward of a training forward only: an eval forward
  // (whose backward, if one comes, gathers again) must not hold the memory until the next backward
  if (frees_after_forward() || !grad_mode || !units_[u].module->is_training()) free(u);
}

// Marks the parameters in the graph of a unit's outputs as used in this pass: a unit's reduction
// waits for exactly these (a parameter unused on this rank's batch would otherwise hold it back to
// the end of the backward, and this rank would issue it after gathers that other ranks issue later).
void FsdpRuntime::trace_used(const std::vector<Tensor>& outputs) {
  // traced_ spans the pass: nodes walked from an earlier unit's outputs are not walked again
  autograd::visit_leaves(outputs, traced_, [&](const TensorImpl* leaf) {
    if (const auto it = param_at_.find(leaf); it != param_at_.end())
      units_[it->second.first].used[it->second.second] = true;
  });
}

void FsdpRuntime::begin_forward_pass() {
  if (in_backward_) return;
  traced_.clear();
  drop_prefetched();
  if (!forward_order_.empty()) last_forward_order_ = std::move(forward_order_);
  forward_order_.clear();
  post_forward_order_.clear();
  for (FlatUnit& unit : units_) {
    unit.forwarded = false;
    unit.needs_backward = false;
  }
}

void FsdpRuntime::pre_backward(size_t u) {
  begin_backward();
  gather(u);
  if (units_[u].backward_started) return;
  units_[u].backward_started = true;
  if (backward_prefetch_ == BackwardPrefetch::BackwardPre) prefetch_after_backward_of(u);
}

void FsdpRuntime::on_gradient(size_t u, size_t k) {
  begin_backward();
  FlatUnit& unit = units_[u];
  STRATA_CHECK(!unit.done,
               "[FullyShardedDataParallel] parameter '{}' received a gradient after unit '{}' had reduced its "
               "gradients in this backward pass: it was used outside the graph of the unit's outputs",
               unit.param_names[k], unit.name);
  if (!unit.awaited[k]) return;  // not seen in a forward's graph: flattened with the others at unit_done
  unit.awaited[k] = false;
  if (--unit.grads_pending == 0) unit_done(u);
}

void FsdpRuntime::reset() {
  if (!in_backward_ || !pass_alive_.expired()) return;
  // The pass raised midway: what it accumulated on the module's parameters is partial (the shards'
  // .grad never saw it), so it is dropped with the reductions in flight, and every unit freed.
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatUnit& unit = units_[u];
    if (unit.work) unit.work->wait();
    unit.work.reset();
    unit.flat_grad = unit.reduced = Tensor();
    for (const Tensor& p : unit.params) p.set_grad(Tensor());
    unit.prefetched = false;
    free(u);
  }
  unreplicated_ = SIZE_MAX;
  in_backward_ = false;
}

void FsdpRuntime::begin_backward() {
  reset();  // the last pass raised before its end
  if (in_backward_) return;
  in_backward_ = true;
  for (FlatUnit& unit : units_) {
    unit.awaited = unit.requires_grad ? unit.used : std::vector<bool>(unit.params.size(), false);
    unit.grads_pending = static_cast<size_t>(std::count(unit.awaited.begin(), unit.awaited.end(), true));
    unit.used.assign(unit.params.size(), false);
    unit.done = false;
    unit.backward_started = false;
  }
  next_reduction_ = 0;
  std::weak_ptr<FsdpRuntime> weak = weak_from_this();
  auto alive = std::make_shared<bool>(true);
  pass_alive_ = alive;
  autograd::queue_callback([weak, alive] {
    if (auto self = weak.lock()) self->finish_backward();
  });
}

void FsdpRuntime::unit_done(size_t u) {
  FlatUnit& unit = units_[u];
  if (unit.done) return;
  unit.done = true;
  if (sync && unit.requires_grad) {
    NoGradGuard no_grad;
    Tensor flat = zeros({unit.padded}, TensorOptions(reduce_dtype(unit), unit.device));
    for (size_t k = 0; k < unit.params.size(); ++k) {
      const Tensor& p = unit.params[k];
      if (!p.grad().defined()) continue;  // unused in this pass: counts as zeros
      flat.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]).copy_(p.grad());
      p.set_grad(Tensor());
    }
    unit.flat_grad = flat;
  }
  if (frees_after_forward()) free(u);
  // before the reduction is issued, as PyTorch's BACKWARD_POST; not for the units counted at the end
  if (backward_prefetch_ == BackwardPrefetch::BackwardPost && in_backward_) prefetch_after_backward_of(u);
  start_ready_reductions();
}

void FsdpRuntime::start_ready_reductions() {
  while (next_reduction_ < units_.size()) {
    FlatUnit& unit = units_[units_.size() - 1 - next_reduction_];
    if (!unit.done) return;
    ++next_reduction_;
    if (!unit.flat_grad.defined()) continue;
    if (sharded()) {
      const int64_t length = unit.shard.numel();
      std::vector<Tensor> parts;
      for (int r = 0; r < group_->size(); ++r) parts.push_back(unit.flat_grad.narrow(0, r * length, length));
      unit.reduced = empty({length}, unit.flat_grad.options());
      // hybrid: the last unit's all-reduce goes first, at the same point of every rank's sequence
      if (replicate_) replicate_reduction(unreplicated_);
      unit.work = group_->reduce_scatter(unit.reduced, parts, ReduceOp::Avg);
      if (replicate_) unreplicated_ = static_cast<size_t>(&unit - units_.data());
    } else {
      unit.reduced = unit.flat_grad;
      unit.work = group_->allreduce(unit.reduced, ReduceOp::Avg);
    }
    unit.flat_grad = Tensor();
  }
}

// The mean over every rank: the reduce-scatter averaged over the shard group, this over the replicas.
void FsdpRuntime::replicate_reduction(size_t u) {
  if (u == SIZE_MAX) return;
  unreplicated_ = SIZE_MAX;
  if (replicate_->size() == 1) return;
  FlatUnit& unit = units_[u];
  unit.work->wait();
  unit.work = replicate_->allreduce(unit.reduced, ReduceOp::Avg);
}

void FsdpRuntime::finish_backward() {
  in_backward_ = false;
  traced_.clear();
  for (size_t u = 0; u < units_.size(); ++u) unit_done(u);  // the gradients that never arrived
  if (replicate_) replicate_reduction(unreplicated_);
  drop_prefetched();
  NoGradGuard no_grad;
  for (FlatUnit& unit : units_) {
    if (!unit.work) continue;
    unit.work->wait();
    unit.work.reset();
    const Tensor& g = unit.shard.grad();
    // reduced in reduce_dtype on the device, kept in the shard's dtype (the master's) and memory
    const DType master = unit.shard.dtype();
    Tensor reduced = unit.reduced.dtype() == master ? unit.reduced : unit.reduced.to(master);
    if (reduced.device() != unit.shard.device()) reduced = reduced.to(unit.shard.device());
    if (g.defined()) g.add_(reduced);  // accumulating over steps without zero_grad
    else unit.shard.set_grad(reduced);
    unit.reduced = Tensor();
  }
  if (strategy_ == ShardingStrategy::ShardGradOp || strategy_ == ShardingStrategy::HybridShardZero2)
    for (size_t u = 0; u < units_.size(); ++u) free(u);
}

}  // namespace strata::dist::detail
