// The caching CPU allocator. Requests are rounded up to a size class (four classes per power
// of two, so at most 25% slack); freed blocks go to a free list per class and are reused by
// the next request of that class. Cached bytes are capped (STRATA_CPU_CACHE_LIMIT_MB,
// default 4096); past the cap, frees go straight back to the system.
//
// Note [Huge pages]
// Blocks of 2 MiB and more start on a 2 MiB boundary and ask Linux for transparent huge pages
// (madvise MADV_HUGEPAGE, honoured where THP is "always" or "madvise"), as PyTorch's CPU
// allocator does when THP_MEM_ALLOC_ENABLE is set. Kernels that stream over large operands, a
// GEMM's packing most of all, then miss the TLB 512 times less often: on a 2-core KVM guest
// dnnl_sgemm ran 8-17% faster at 1024^3 to 4096^3 with its operands in huge pages.
// STRATA_CPU_HUGE_PAGES=0 turns this off.
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <strata/core/allocator.hpp>
#include <strata/core/error.hpp>

namespace strata {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kHugePage = size_t(2) << 20;

// A fresh block of `bytes` (a size class), or null.
void* system_alloc(size_t bytes, bool huge_pages) {
  if (!huge_pages || bytes < kHugePage) return std::aligned_alloc(kAlignment, bytes);
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return p;
}

size_t size_class(size_t n) {
  if (n <= 512) return (n + 63) & ~size_t(63);
  // four classes per power of two: 2^k * {1, 1.25, 1.5, 1.75}
  size_t p = size_t(1) << (63 - __builtin_clzll(n));
  size_t step = p / 4;
  return (n + step - 1) / step * step;
}

class CachingCpuAllocator final : public Allocator {
 public:
  CachingCpuAllocator() {
    if (const char* env = std::getenv("STRATA_CPU_CACHE_LIMIT_MB")) cache_limit_ = size_t(std::atoll(env)) << 20;
    if (const char* env = std::getenv("STRATA_CPU_HUGE_PAGES")) huge_pages_ = std::atoi(env) != 0;
  }
  ~CachingCpuAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // past 2^62 bytes the size-class rounding would wrap (to a tiny block); no machine has them
    STRATA_CHECK(nbytes <= (size_t(1) << 62), "[cpu allocator] out of memory allocating {} bytes ({} in use, {} "
                 "reserved)", nbytes, stats_.bytes_in_use, stats_.bytes_reserved);
    size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= cls;
      ++stats_.num_cache_hits;
    } else {
      p = system_alloc(cls, huge_pages_);
      if (!p) {
        // give the cache back and try once more before failing
        release_cache_locked();
        p = system_alloc(cls, huge_pages_);
      }
      STRATA_CHECK(p != nullptr, "[cpu allocator] out of memory allocating {} bytes ({} in use, {} reserved)", nbytes,
                   stats_.bytes_in_use, stats_.bytes_reserved);
      stats_.bytes_reserved += static_cast<int64_t>(cls);
      ++stats_.num_system_allocs;
    }
    stats_.bytes_in_use += static_cast<int64_t>(cls);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    ++stats_.num_allocs;
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= static_cast<int64_t>(cls);
    ++stats_.num_frees;
    if (cached_bytes_ + cls <= cache_limit_) {
      free_[cls].push_back(ptr);
      cached_bytes_ += cls;
    } else {
      std::free(ptr);
      stats_.bytes_reserved -= static_cast<int64_t>(cls);
    }
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  Device device() const override { return kCPU; }

 private:
  void release_cache_locked() {
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      stats_.bytes_reserved -= static_cast<int64_t>(cls * blocks.size());
      blocks.clear();
    }
    cached_bytes_ = 0;
  }

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t cache_limit_ = size_t(4096) << 20;
  bool huge_pages_ = true;  // Note [Huge pages]
  MemoryStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  // Leaked on purpose: tensors held in static storage may be freed after main returns.
  static auto* a = new CachingCpuAllocator();
  return *a;
}

MemoryStats cpu_memory_stats() { return cpu_allocator().stats(); }

}  // namespace strata
