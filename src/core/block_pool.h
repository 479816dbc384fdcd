// The block management of the caching device allocator, apart from any device API so it is
// tested on the CPU with a fake backend (tests/core/test_block_pool.cpp). The CUDA allocator
// (src/core/cuda/allocator.cpp) plugs cudaMalloc/cudaFree and cudaEvent in through
// PoolBackend.
//
// Note [Block pool policy] (PyTorch's CUDACachingAllocator policy, which training loops are
// tuned for):
// - Requests are rounded up to a multiple of 512 bytes.
// - Rounded sizes up to 1 MiB are "small" and carved from 2 MiB segments; larger ones are
//   "large": under 10 MiB from 20 MiB segments, else from a segment of the size rounded up
//   to 2 MiB. Small and large blocks never share a segment, so small tensors do not pin
//   down large segments.
// - A free block is found by best fit (the smallest cached block that fits) among the free
//   blocks of the same stream, then split when the rest is worth keeping (>= 512 bytes for
//   small blocks, > 1 MiB for large ones). Freed blocks merge with free neighbours of their
//   segment.
// - A block belongs to the stream it was allocated on: the stream's order makes its reuse
//   there safe without waiting. A block also used on other streams (record_stream) is, when
//   freed, held back until an event recorded on each of those streams at free time has
//   completed.
// - When the backend is out of memory, every cached whole segment is released and the
//   request is retried once; if it still fails, Error says how much was asked and what the
//   pool holds.
//
// Note [Graph pools] (PyTorch's private pools for CUDA graph capture):
// - A capture routes the allocations of its capture id to a private pool (PoolId, never 0).
//   Private pools have their own segments and free lists, so an allocation during capture
//   never reuses memory freed outside it, and memory freed inside a capture is reused only by
//   later allocations of the same pool: a replay writes every block the capture used.
// - A pool is held once per capture that used it (its graph holds it until reset); graphs
//   captured one after another may share a pool. When the last hold goes, the pool's blocks,
//   free and live, join the ordinary pool: its memory is then cached for anyone.
// - While any capture is underway nothing may wait for the device or query events: pending
//   frees are not processed, a freed block used on other streams waits in a deferred list
//   until the last capture ends, and out-of-memory does not release the cache (cudaFree
//   waits for the device). Blocks of a private pool ignore record_stream: the graph orders
//   its own streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <strata/core/allocator.hpp>

namespace strata::detail {

using StreamId = uintptr_t;  // a stream handle as an integer (0: the default stream)
using PoolId = uint64_t;     // a private pool (Note [Graph pools]); 0: the ordinary pool
using CaptureId = uint64_t;  // a graph capture underway (CUDA's capture id); 0: none

/// What the pool needs from a device. Events are opaque handles made by record_event.
class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  /// `nbytes` of device memory, or nullptr when the device is out of memory (other failures
  /// raise Error).
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr, size_t nbytes) = 0;
  /// An event recorded now on `stream`: done once the work queued there so far has finished.
  /// Called on free, which may run in a destructor, so it must not raise: nullptr means the
  /// work has already finished (the backend waited for it when it could not record).
  virtual void* record_event(StreamId stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual void release_event(void* event) = 0;
  /// Why the last raw_alloc failed, for the out-of-memory message ("" when nothing to add).
  virtual std::string oom_detail() { return {}; }
};

struct PoolStats {
  int64_t allocated_bytes = 0;
  int64_t requested_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t inactive_split_bytes = 0;
  double fragmentation = 0;
  int64_t num_segments = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_cache_hits = 0;
  int64_t num_raw_allocs = 0;
  int64_t num_raw_frees = 0;
  int64_t num_ooms = 0;
  int64_t num_pending_frees = 0;
  int64_t private_pool_bytes = 0;  // reserved bytes held by private pools
  int64_t num_private_pools = 0;
};

/// What an Allocator built on a pool reports as its stats().
inline MemoryStats allocator_stats(const PoolStats& p) {
  MemoryStats s;
  s.bytes_in_use = p.allocated_bytes;
  s.bytes_reserved = p.reserved_bytes;
  s.peak_bytes_in_use = p.peak_allocated_bytes;
  s.num_allocs = p.num_allocs;
  s.num_frees = p.num_frees;
  s.num_cache_hits = p.num_cache_hits;
  s.num_system_allocs = p.num_raw_allocs;
  return s;
}

class BlockPool {
 public:
  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallSize = size_t(1) << 20;       // largest small block
  static constexpr size_t kSmallBuffer = size_t(2) << 20;     // small-block segment
  static constexpr size_t kLargeBuffer = size_t(20) << 20;    // segment for 1-10 MiB blocks
  static constexpr size_t kMinLargeAlloc = size_t(10) << 20;  // from here: own segment
  static constexpr size_t kRoundLarge = size_t(2) << 20;

  /// `device_name` ("cuda:0") appears in error messages, prefixed by "[`op`]".
  BlockPool(PoolBackend& backend, std::string device_name, std::string op = "cuda allocator");
  /// Waits for pending events and returns every segment to the backend; blocks still live
  /// are released with their segments.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// A block of at least `nbytes` for use on `stream`; nullptr for zero bytes. A nonzero
  /// `capture` takes the block from the private pool that capture allocates to.
  void* allocate(size_t nbytes, StreamId stream, CaptureId capture = 0);
  void free(void* ptr);
  /// Marks the live block starting at `ptr` as used on `stream` too; false (and nothing
  /// done) when `ptr` is not the start of a live block of this pool.
  bool record_stream(void* ptr, StreamId stream);
  /// Returns every cached whole segment to the backend (after waiting for pending events).
  void empty_cache();
  PoolStats stats() const;
  void reset_peak();

  // ---- private pools for graph capture (Note [Graph pools]); block_pool_graph.cpp
  /// Routes the allocations of `capture` to private pool `pool` (made on first use) and holds
  /// the pool once, for the graph being captured. Raises if `capture` is already underway.
  void begin_capture(CaptureId capture, PoolId pool);
  /// Stops routing `capture`; the pool stays held until release_pool. When no capture is
  /// left underway, the frees deferred during capture get their events.
  void end_capture(CaptureId capture);
  /// Drops one hold of `pool`; at the last, its blocks join the ordinary pool.
  void release_pool(PoolId pool);
  bool capture_underway() const;
  /// Reserved bytes of private pool `pool` (0 when it does not exist).
  int64_t pool_reserved_bytes(PoolId pool) const;

  static size_t round_size(size_t nbytes);
  /// Bytes of the segment made for a block of `rounded` bytes.
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    StreamId stream = 0;
    PoolId pool = 0;
    bool small = false;
    bool allocated = false;
    int pending_events = 0;          // events still to complete before the block is free
    Block* prev = nullptr;           // neighbours in the same segment
    Block* next = nullptr;
    std::vector<StreamId> uses;      // other streams that used the block (record_stream)
  };
  struct BySize {  // (stream, size, address): lower_bound gives the best fit on a stream
    bool operator()(const Block* a, const Block* b) const;
  };
  struct PendingEvent {
    void* event;
    Block* block;
  };
  using FreeSet = std::set<Block*, BySize>;
  struct PrivatePool {
    FreeSet small_free, large_free;
    int holds = 0;               // captures that used it (their graphs hold it)
    int64_t reserved_bytes = 0;
  };

  FreeSet& free_set(const Block* b);
  FreeSet& free_set(bool small, PoolId pool);
  Block* find_free(size_t size, bool small, StreamId stream, PoolId pool);
  // nullptr when out of memory
  Block* new_segment(size_t size, bool small, StreamId stream, PoolId pool);
  PoolId pool_of(CaptureId capture) const;
  void free_with_events(Block* b);  // holds b back until the streams that used it pass
  void merge_into_ordinary(PoolId pool);
  void split(Block* b, size_t size);
  void free_block(Block* b);  // merges with free neighbours, then caches
  void process_events();
  void release_cached_blocks();  // waits for pending events, frees whole free segments
  [[noreturn]] void raise_oom(size_t nbytes, size_t rounded, size_t segment);
  void update_peaks();

  PoolBackend& backend_;
  std::string device_name_;
  std::string op_;
  mutable std::mutex mutex_;
  FreeSet small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;
  std::vector<PendingEvent> pending_;
  std::unordered_map<PoolId, PrivatePool> private_;
  std::unordered_map<CaptureId, PoolId> captures_;
  std::vector<Block*> deferred_;  // freed during capture, used on other streams
  PoolStats stats_;
};

}  // namespace strata::detail
