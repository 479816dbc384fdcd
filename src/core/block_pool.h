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

  /// A block of at least `nbytes` for use on `stream`; nullptr for zero bytes.
  void* allocate(size_t nbytes, StreamId stream);
  void free(void* ptr);
  /// Marks the live block starting at `ptr` as used on `stream` too; false (and nothing
  /// done) when `ptr` is not the start of a live block of this pool.
  bool record_stream(void* ptr, StreamId stream);
  /// Returns every cached whole segment to the backend (after waiting for pending events).
  void empty_cache();
  PoolStats stats() const;
  void reset_peak();

  static size_t round_size(size_t nbytes);
  /// Bytes of the segment made for a block of `rounded` bytes.
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    StreamId stream = 0;
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

  FreeSet& free_set(const Block* b) { return b->small ? small_free_ : large_free_; }
  Block* find_free(size_t size, bool small, StreamId stream);
  Block* new_segment(size_t size, bool small, StreamId stream);  // nullptr when out of memory
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
  PoolStats stats_;
};

}  // namespace strata::detail
