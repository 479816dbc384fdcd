// The pinned host allocator's cache; see host_cache.h.
#include "core/host_cache.h"

#include <algorithm>
#include <bit>

#include <strata/core/error.hpp>

namespace strata::detail {

size_t HostCache::round_size(size_t nbytes) { return std::bit_ceil(std::max(nbytes, kMinSize)); }

HostCache::~HostCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [event, block] : pending_) {
    backend_.synchronize_event(event);
    backend_.release_event(event);
  }
  for (auto& [ptr, b] : blocks_) {
    backend_.raw_free(b->ptr);
    delete b;
  }
}

void* HostCache::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  STRATA_CHECK(nbytes <= (size_t(1) << 62), "[pinned allocator] cannot allocate {} bytes", nbytes);
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  Block* b = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    b = it->second.back();
    it->second.pop_back();
    ++stats_.num_cache_hits;
  } else {
    void* p = backend_.raw_alloc(size);
    if (!p) {
      release_free();
      p = backend_.raw_alloc(size);
    }
    if (!p) {
      ++stats_.num_ooms;
      detail::throw_error("[pinned allocator] out of page-locked host memory allocating {} bytes (rounded to {}): "
                          "{} bytes in use, {} reserved", nbytes, size, stats_.allocated_bytes, stats_.reserved_bytes);
    }
    b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = size;
    blocks_.emplace(b->ptr, b);
    stats_.reserved_bytes += static_cast<int64_t>(size);
    ++stats_.num_segments;
    ++stats_.num_raw_allocs;
  }
  b->allocated = true;
  b->requested = nbytes;
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.requested_bytes += static_cast<int64_t>(nbytes);
  ++stats_.num_allocs;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return b->ptr;
}

void HostCache::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(static_cast<char*>(ptr));
  STRATA_CHECK(it != blocks_.end() && it->second->allocated,
               "[pinned allocator] free of {}, which this allocator did not hand out (or already freed)", ptr);
  Block* b = it->second;
  b->allocated = false;
  stats_.allocated_bytes -= static_cast<int64_t>(b->size);
  stats_.requested_bytes -= static_cast<int64_t>(b->requested);
  ++stats_.num_frees;
  if (b->uses.empty()) {
    free_[b->size].push_back(b);
    return;
  }
  for (auto [device, stream] : b->uses) {
    void* event = backend_.record_event(device, stream);
    if (!event) continue;  // the stream was waited for
    pending_.emplace_back(event, b);
    ++b->pending_events;
  }
  b->uses.clear();
  if (b->pending_events == 0) {
    free_[b->size].push_back(b);
    return;
  }
  ++stats_.num_pending_frees;
}

bool HostCache::record_stream(const void* ptr, int device, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const char* p = static_cast<const char*>(ptr);
  auto it = blocks_.upper_bound(const_cast<char*>(p));
  if (it == blocks_.begin()) return false;
  Block* b = std::prev(it)->second;
  if (!b->allocated || p >= b->ptr + b->size) return false;
  auto use = std::make_pair(device, stream);
  if (std::find(b->uses.begin(), b->uses.end(), use) == b->uses.end()) b->uses.push_back(use);
  return true;
}

void HostCache::process_events() {
  auto done = [&](const std::pair<void*, Block*>& e) {
    if (!backend_.event_done(e.first)) return false;
    backend_.release_event(e.first);
    if (--e.second->pending_events == 0) {
      --stats_.num_pending_frees;
      free_[e.second->size].push_back(e.second);
    }
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

void HostCache::release_free() {
  for (auto& [event, b] : pending_) {
    backend_.synchronize_event(event);
    backend_.release_event(event);
    if (--b->pending_events == 0) {
      --stats_.num_pending_frees;
      free_[b->size].push_back(b);
    }
  }
  pending_.clear();
  for (auto& [size, list] : free_) {
    for (Block* b : list) {
      blocks_.erase(b->ptr);
      backend_.raw_free(b->ptr);
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      --stats_.num_segments;
      ++stats_.num_raw_frees;
      delete b;
    }
  }
  free_.clear();
}

void HostCache::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_free();
}

PoolStats HostCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostCache::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace strata::detail
