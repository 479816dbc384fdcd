// The cache behind the pinned host allocator, apart from any device API so it is tested on
// the CPU (tests/core/test_host_cache.cpp). Page-locking memory is slow (cudaHostAlloc takes
// milliseconds) and freeing it stalls the device, so a DataLoader that pins every batch
// would pay both each step. Freed buffers are kept by size class (powers of two) and reused.
// A buffer that an async copy on some stream used (record_stream, called by the copy) is
// reused only once an event recorded on that stream at free time has completed, so a copy
// still reading or writing it never sees another tensor's bytes (PyTorch's
// CachingHostAllocator does the same).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/block_pool.h"

namespace strata::detail {

/// What the host cache needs: page-locked memory and events on (device, stream) pairs.
class HostBackend {
 public:
  virtual ~HostBackend() = default;
  /// nullptr when out of memory.
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  /// As PoolBackend::record_event: never raises; nullptr when the stream's work is done.
  virtual void* record_event(int device, StreamId stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual void release_event(void* event) = 0;
};

class HostCache {
 public:
  static constexpr size_t kMinSize = 512;

  explicit HostCache(HostBackend& backend) : backend_(backend) {}
  /// Waits for pending events and frees every buffer, live ones included.
  ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  /// nullptr for zero bytes; raises Error when even an emptied cache cannot get the memory.
  void* allocate(size_t nbytes);
  void free(void* ptr);
  /// Marks the live buffer holding `ptr` (any address inside it) as used by work on
  /// (device, stream); false when no live buffer of this cache holds it.
  bool record_stream(const void* ptr, int device, StreamId stream);
  /// Frees every cached buffer (after waiting for pending events).
  void empty_cache();
  PoolStats stats() const;
  void reset_peak();

  static size_t round_size(size_t nbytes);  // next power of two, at least kMinSize

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    bool allocated = false;
    int pending_events = 0;
    std::vector<std::pair<int, StreamId>> uses;
  };
  void process_events();
  void release_free();  // waits for pending events, frees every free buffer

  HostBackend& backend_;
  mutable std::mutex mutex_;
  std::map<char*, Block*> blocks_;                // every buffer, by address
  std::map<size_t, std::vector<Block*>> free_;    // cached buffers by size
  std::vector<std::pair<void*, Block*>> pending_;  // (event, block)
  PoolStats stats_;
};

}  // namespace strata::detail
