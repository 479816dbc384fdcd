// Allocators and their statistics. The CPU allocator caches freed blocks by size class so a
// training loop that allocates the same shapes every step stops calling the system allocator.
#pragma once

#include <cstddef>
#include <cstdint>

#include <strata/core/device.hpp>
#include <strata/core/export.hpp>

namespace strata {

struct MemoryStats {
  int64_t bytes_in_use = 0;       ///< bytes handed out and not yet returned
  int64_t bytes_reserved = 0;     ///< bytes held from the system: in use plus cached
  int64_t peak_bytes_in_use = 0;  ///< high-water mark of bytes_in_use since the last reset
  int64_t num_allocs = 0;         ///< allocations served (cache hits included)
  int64_t num_frees = 0;
  int64_t num_cache_hits = 0;     ///< allocations served from the cache
  int64_t num_system_allocs = 0;  ///< allocations that went to the system
};

class STRATA_API Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns memory aligned to at least 64 bytes; nullptr for zero bytes.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  /// Returns all cached, unused blocks to the system.
  virtual void empty_cache() {}
  virtual void reset_peak() {}
  virtual Device device() const = 0;
};

/// The process-wide caching CPU allocator.
STRATA_API Allocator& cpu_allocator();
/// Page-locked host memory for fast async copies to a GPU; plain CPU memory (from
/// cpu_allocator) in a build without CUDA or on a machine without a GPU.
STRATA_API Allocator& pinned_allocator();
/// True when pinned_allocator() really returns page-locked memory.
STRATA_API bool pinned_memory_is_page_locked();

STRATA_API MemoryStats cpu_memory_stats();

}  // namespace strata
