// The block pool's private pools for graph capture: Note [Graph pools] (block_pool.h).
#include "core/block_pool.h"

#include <strata/core/error.hpp>

namespace strata::detail {

void BlockPool::begin_capture(CaptureId capture, PoolId pool) {
  STRATA_CHECK(capture != 0 && pool != 0, "[{}] begin_capture needs a nonzero capture id and pool id", op_);
  std::lock_guard<std::mutex> lock(mutex_);
  STRATA_CHECK(!captures_.count(capture), "[{}] capture {} on {} has already begun", op_, capture, device_name_);
  ++private_[pool].holds;
  captures_.emplace(capture, pool);
}

void BlockPool::end_capture(CaptureId capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATA_CHECK(captures_.erase(capture) == 1, "[{}] end_capture of capture {}, which is not underway on {}", op_,
               capture, device_name_);
  if (!captures_.empty()) return;
  std::vector<Block*> deferred = std::move(deferred_);
  deferred_.clear();
  for (Block* b : deferred) {
    --b->pending_events;
    --stats_.num_pending_frees;
    free_with_events(b);
  }
}

void BlockPool::release_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_.find(pool);
  STRATA_CHECK(it != private_.end() && it->second.holds > 0, "[{}] release of graph pool {}, which {} does not hold",
               op_, pool, device_name_);
  if (--it->second.holds == 0) merge_into_ordinary(pool);
}

bool BlockPool::capture_underway() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !captures_.empty();
}

int64_t BlockPool::pool_reserved_bytes(PoolId pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_.find(pool);
  return it == private_.end() ? 0 : it->second.reserved_bytes;
}

PoolId BlockPool::pool_of(CaptureId capture) const {
  auto it = captures_.find(capture);
  STRATA_CHECK(it != captures_.end(),
               "[{}] allocation on {} from a stream capturing a CUDA graph that strata did not begin (capture {}): "
               "capture with strata::cuda::Graph so its memory comes from a graph pool",
               op_, device_name_, capture);
  return it->second;
}

// The pool's live blocks stay live and join the ordinary pool when freed; its free blocks
// are cached for anyone at once. Neighbours in a segment always share a pool, so merging
// stays within the ordinary pool from here on.
void BlockPool::merge_into_ordinary(PoolId pool) {
  PrivatePool& p = private_.at(pool);
  for (auto& [ptr, b] : live_)
    if (b->pool == pool) b->pool = 0;
  for (FreeSet* set : {&p.small_free, &p.large_free})
    for (Block* b : *set) {
      b->pool = 0;
      free_set(b).insert(b);
    }
  private_.erase(pool);
}

}  // namespace strata::detail
