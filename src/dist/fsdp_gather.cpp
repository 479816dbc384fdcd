// FullyShardedDataParallel's all-gathers: gathering a unit's flat parameter, freeing it, and
// prefetching (issuing the next unit's all-gather before it is needed).
//
// Note [FSDP prefetch]: every rank must issue the same collectives in the same order, so a
// prefetch is decided only from what every rank sees alike: the order the units' forwards started
// in the last pass (forward_prefetch: when unit u's forward starts, the unit after u in that order
// that has not run yet in this pass) and the order they ended in this pass, reversed (the
// backward's order, PyTorch's reverse post-forward order: when u's backward starts, BackwardPre,
// or its gradients are all in, BackwardPost, the unit after u whose backward has not started and
// whose outputs require grad: a unit without a backward, a frozen first layer, is never gathered).
// One unit is prefetched at a time, as in PyTorch. A prefetched gather is waited for when the
// unit is used; one never used (the graph changed) is freed at the end of the backward or at the
// next forward. Prefetching changes when a gather is issued, never what it gathers.
#include "dist/fsdp_runtime.h"

#include <algorithm>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist::detail {

void FsdpRuntime::record(GatherEvent::Kind kind, size_t u) {
  if (gather_events) gather_events->push_back({kind, u, in_backward_});
}

void FsdpRuntime::start_gather(size_t u, DType dtype, GatherEvent::Kind kind) {
  FlatUnit& unit = units_[u];
  NoGradGuard no_grad;
  record(kind, u);
  // cast before the gather, as PyTorch does: the low-precision copy is what travels
  Tensor source = unit.shard.dtype() == dtype ? unit.shard.detach() : unit.shard.detach().to(dtype);
  if (source.device() != unit.device) source = source.to(unit.device);  // CPU offload: in the cast dtype
  unit.pending_version = unit.shard.version();
  if (!sharded()) {
    unit.pending = source;
    return;
  }
  unit.pending = empty({unit.padded}, source.options());
  const int64_t length = unit.shard.numel();
  std::vector<Tensor> parts;
  for (int r = 0; r < group_->size(); ++r) parts.push_back(unit.pending.narrow(0, r * length, length));
  unit.gather_work = group_->allgather(parts, source);
}

void FsdpRuntime::complete_gather(size_t u) {
  FlatUnit& unit = units_[u];
  if (unit.gather_work) unit.gather_work->wait();
  unit.gather_work.reset();
  record(GatherEvent::Wait, u);
  unit.full = std::move(unit.pending);
  unit.pending = Tensor();
  unit.gathered_version = unit.pending_version;
  gathered_[unit.full.storage().get()] = u;
  for (size_t k = 0; k < unit.params.size(); ++k)
    unit.params[k].set_data(unit.full.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]));
}

void FsdpRuntime::gather(size_t u, bool master) {
  FlatUnit& unit = units_[u];
  unit.prefetched = false;
  if (unit.pending.defined()) complete_gather(u);  // a prefetch: its values are the gathered ones now
  const DType dtype = master ? unit.shard.dtype() : compute_dtype(unit);
  if (unit.full.defined()) {
    if (unit.full.dtype() == dtype) {
      if (unit.full.storage() == unit.shard.storage()) return;  // NoShard: views of the shard for good
      if (unit.gathered_version == unit.shard.version()) return;
    }
    // the shard changed since (an optimizer step after a forward whose backward never came), or
    // mixed precision needs the other dtype (summon_full_params, then the compute)
    release(u);
  }
  start_gather(u, dtype, GatherEvent::Issue);
  complete_gather(u);
}

void FsdpRuntime::prefetch(size_t u) {
  FlatUnit& unit = units_[u];
  if (!sharded() || unit.pending.defined()) return;
  const DType dtype = compute_dtype(unit);
  if (unit.full.defined()) {
    if (unit.full.dtype() == dtype && unit.gathered_version == unit.shard.version()) return;
    release(u);
  }
  start_gather(u, dtype, GatherEvent::Prefetch);
  unit.prefetched = true;
}

void FsdpRuntime::prefetch_after_forward_of(size_t u) {
  if (!forward_prefetch_) return;
  const auto at = std::find(last_forward_order_.begin(), last_forward_order_.end(), u);
  const auto next = std::find_if(at, last_forward_order_.end(), [&](size_t v) { return !units_[v].forwarded; });
  if (next != last_forward_order_.end()) prefetch(*next);
}

void FsdpRuntime::prefetch_after_backward_of(size_t u) {
  const auto at = std::find(post_forward_order_.rbegin(), post_forward_order_.rend(), u);
  const auto next = std::find_if(at, post_forward_order_.rend(), [&](size_t v) {
    return units_[v].needs_backward && !units_[v].backward_started && !units_[v].done;
  });
  if (next != post_forward_order_.rend()) prefetch(*next);
}

void FsdpRuntime::drop_prefetched() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].prefetched) {
      units_[u].prefetched = false;
      release(u);
    }
}

void FsdpRuntime::free(size_t u) {
  if (sharded()) release(u);
}

void FsdpRuntime::release(size_t u) {
  FlatUnit& unit = units_[u];
  if (unit.gather_work) unit.gather_work->wait();  // the collective still writes into `pending`
  unit.gather_work.reset();
  unit.pending = Tensor();
  if (!unit.full.defined()) return;
  gathered_.erase(unit.full.storage().get());
  for (const Tensor& p : unit.params) p.set_data(empty({0}, TensorOptions(unit.shard.dtype(), unit.device)));
  unit.full = Tensor();
}

void FsdpRuntime::end_summon(size_t u, bool was_gathered) {
  FlatUnit& unit = units_[u];
  if (!was_gathered) free(u);
  if (unit.full.defined() && unit.full.dtype() != compute_dtype(unit)) release(u);  // gathered again when used
}

void FsdpRuntime::write_back(size_t u) {
  FlatUnit& unit = units_[u];
  // NoShard (without CPU offload): the parameters are the shard's memory
  if (!unit.full.defined() || unit.full.storage() == unit.shard.storage()) return;
  NoGradGuard no_grad;
  const int64_t length = unit.shard.numel(), rank = sharded() ? group_->rank() : 0;
  unit.shard.detach().copy_(unit.full.narrow(0, rank * length, length));
  unit.gathered_version = unit.shard.version();  // `full` still holds its values
}

}  // namespace strata::dist::detail
