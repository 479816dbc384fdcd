// The caching allocator's block management; policy in Note [Block pool policy] (block_pool.h).
#include "core/block_pool.h"
#include "core/format_bytes.h"

#include <algorithm>
#include <tuple>

#include <strata/core/error.hpp>

namespace strata::detail {

bool BlockPool::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

size_t BlockPool::round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t BlockPool::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

BlockPool::BlockPool(PoolBackend& backend, std::string device_name, std::string op)
    : backend_(backend), device_name_(std::move(device_name)), op_(std::move(op)) {}

BlockPool::~BlockPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const PendingEvent& e : pending_) {
    backend_.synchronize_event(e.event);
    backend_.release_event(e.event);
  }
  // Every segment is reached from one of its blocks: live, cached or pending.
  std::set<Block*> heads;
  auto add_head = [&](Block* b) {
    while (b->prev) b = b->prev;
    heads.insert(b);
  };
  for (auto& [ptr, b] : live_) add_head(b);
  for (Block* b : small_free_) add_head(b);
  for (Block* b : large_free_) add_head(b);
  for (auto& [id, pool] : private_)
    for (const FreeSet* set : {&pool.small_free, &pool.large_free})
      for (Block* b : *set) add_head(b);
  for (const PendingEvent& e : pending_) add_head(e.block);
  for (Block* b : deferred_) add_head(b);
  for (Block* head : heads) {
    size_t total = 0;
    for (Block* b = head; b; b = b->next) total += b->size;
    backend_.raw_free(head->ptr, total);
    for (Block* b = head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

void* BlockPool::allocate(size_t nbytes, StreamId stream, CaptureId capture) {
  if (nbytes == 0) return nullptr;
  STRATA_CHECK(nbytes <= (size_t(1) << 62), "[{}] cannot allocate {} bytes on {}", op_, nbytes, device_name_);
  std::lock_guard<std::mutex> lock(mutex_);
  const PoolId pool = capture ? pool_of(capture) : 0;
  if (captures_.empty()) process_events();  // querying events is not allowed during capture
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  Block* b = find_free(size, small, stream, pool);
  if (b) ++stats_.num_cache_hits;
  else b = new_segment(size, small, stream, pool);
  if (!b && captures_.empty()) {
    // Cached memory may be what the device lacks: wait for pending frees, give back every
    // whole cached segment and try once more (not during capture: cudaFree waits for the device).
    release_cached_blocks();
    b = find_free(size, small, stream, pool);
    if (b) ++stats_.num_cache_hits;
    else b = new_segment(size, small, stream, pool);
  }
  if (!b) raise_oom(nbytes, size, segment_size(size));
  split(b, size);
  b->allocated = true;
  b->requested = nbytes;
  live_.emplace(b->ptr, b);
  stats_.allocated_bytes += static_cast<int64_t>(b->size);
  stats_.requested_bytes += static_cast<int64_t>(nbytes);
  ++stats_.num_allocs;
  update_peaks();
  return b->ptr;
}

BlockPool::FreeSet& BlockPool::free_set(bool small, PoolId pool) {
  if (pool == 0) return small ? small_free_ : large_free_;
  PrivatePool& p = private_.at(pool);
  return small ? p.small_free : p.large_free;
}

BlockPool::FreeSet& BlockPool::free_set(const Block* b) { return free_set(b->small, b->pool); }

BlockPool::Block* BlockPool::find_free(size_t size, bool small, StreamId stream, PoolId pool) {
  FreeSet& set = free_set(small, pool);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

BlockPool::Block* BlockPool::new_segment(size_t size, bool small, StreamId stream, PoolId pool) {
  const size_t seg = segment_size(size);
  void* p = backend_.raw_alloc(seg);
  if (!p) return nullptr;
  Block* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = seg;
  b->stream = stream;
  b->small = small;
  b->pool = pool;
  if (pool) private_.at(pool).reserved_bytes += static_cast<int64_t>(seg);
  stats_.reserved_bytes += static_cast<int64_t>(seg);
  ++stats_.num_segments;
  ++stats_.num_raw_allocs;
  return b;
}

void BlockPool::split(Block* b, size_t size) {
  const size_t rest = b->size - size;
  if (b->small ? rest < kMinBlockSize : rest <= kSmallSize) return;  // keep the slack in b
  Block* r = new Block;
  r->ptr = b->ptr + size;
  r->size = rest;
  r->stream = b->stream;
  r->small = b->small;
  r->pool = b->pool;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  free_set(r).insert(r);
}

void BlockPool::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  STRATA_CHECK(it != live_.end(), "[{}] free of {} on {}, which this allocator did not hand out (or already freed)",
               op_, ptr, device_name_);
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.allocated_bytes -= static_cast<int64_t>(b->size);
  stats_.requested_bytes -= static_cast<int64_t>(b->requested);
  ++stats_.num_frees;
  if (b->pool) b->uses.clear();  // a graph orders its own streams (Note [Graph pools])
  if (b->uses.empty()) {
    free_block(b);
    return;
  }
  if (!captures_.empty()) {  // no events while a capture is underway: end_capture records them
    deferred_.push_back(b);
    ++b->pending_events;  // not merged with freed neighbours while deferred
    ++stats_.num_pending_frees;
    return;
  }
  free_with_events(b);
}

void BlockPool::free_with_events(Block* b) {
  // Work queued on the other streams may still read or write the block: reuse waits for it.
  for (StreamId s : b->uses) {
    void* event = backend_.record_event(s);
    if (!event) continue;  // the stream was waited for
    pending_.push_back({event, b});
    ++b->pending_events;
  }
  b->uses.clear();
  if (b->pending_events == 0) {
    free_block(b);
    return;
  }
  ++stats_.num_pending_frees;
}

void BlockPool::free_block(Block* b) {
  auto mergeable = [](const Block* n) { return n && !n->allocated && n->pending_events == 0; };
  if (mergeable(b->prev)) {
    Block* p = b->prev;
    free_set(p).erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (mergeable(b->next)) {
    Block* n = b->next;
    free_set(n).erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  free_set(b).insert(b);
}

void BlockPool::process_events() {
  auto done = [&](const PendingEvent& e) {
    if (!backend_.event_done(e.event)) return false;
    backend_.release_event(e.event);
    if (--e.block->pending_events == 0) {
      --stats_.num_pending_frees;
      free_block(e.block);
    }
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

void BlockPool::release_cached_blocks() {
  for (const PendingEvent& e : pending_) {
    backend_.synchronize_event(e.event);
    backend_.release_event(e.event);
    if (--e.block->pending_events == 0) {
      --stats_.num_pending_frees;
      free_block(e.block);
    }
  }
  pending_.clear();
  for (FreeSet* set : {&small_free_, &large_free_}) {
    for (auto it = set->begin(); it != set->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment that still holds live blocks
        ++it;
        continue;
      }
      it = set->erase(it);
      backend_.raw_free(b->ptr, b->size);
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      --stats_.num_segments;
      ++stats_.num_raw_frees;
      delete b;
    }
  }
}

bool BlockPool::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
    b->uses.push_back(stream);
  return true;
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATA_CHECK(captures_.empty(), "[{}] empty_cache while a CUDA graph is being captured on {}: releasing memory "
               "waits for the device, which a capture does not allow", op_, device_name_);
  release_cached_blocks();
}

PoolStats BlockPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PoolStats s = stats_;
  s.inactive_split_bytes = 0;
  for (const FreeSet* set : {&small_free_, &large_free_})
    for (const Block* b : *set)
      if (b->prev || b->next) s.inactive_split_bytes += static_cast<int64_t>(b->size);
  for (const auto& [id, pool] : private_) s.private_pool_bytes += pool.reserved_bytes;
  s.num_private_pools = static_cast<int64_t>(private_.size());
  s.fragmentation = s.reserved_bytes ? static_cast<double>(s.inactive_split_bytes) / static_cast<double>(s.reserved_bytes) : 0.0;
  return s;
}

void BlockPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void BlockPool::update_peaks() {
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

void BlockPool::raise_oom(size_t nbytes, size_t rounded, size_t segment) {
  ++stats_.num_ooms;
  int64_t cached = stats_.reserved_bytes - stats_.allocated_bytes;
  std::string detail = backend_.oom_detail();
  throw Error(fmt::format(
      "[{}] out of memory on {} allocating {} bytes ({}; rounded to {}, needing a new {} segment): "
      "{} allocated, {} reserved in {} segments ({} cached in partly used segments), peak {} allocated, "
      "{} allocations and {} frees so far{}{}",
      op_, device_name_, nbytes, format_bytes(static_cast<int64_t>(nbytes)), rounded,
      format_bytes(static_cast<int64_t>(segment)), format_bytes(stats_.allocated_bytes),
      format_bytes(stats_.reserved_bytes), stats_.num_segments, format_bytes(cached),
      format_bytes(stats_.peak_allocated_bytes), stats_.num_allocs, stats_.num_frees, detail.empty() ? "" : "; ",
      detail));
}

}  // namespace strata::detail
