// The pinned host allocator's cache (src/core/host_cache.*) against a fake backend: buffers
// are reused by size class, and a buffer an async copy used waits for that stream's event.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include <strata/core/error.hpp>

#include "core/host_cache.h"

using strata::detail::HostCache;
using strata::detail::StreamId;

namespace {

class FakeHost final : public strata::detail::HostBackend {
 public:
  size_t capacity = size_t(1) << 30;
  size_t in_use = 0;
  int raw_allocs = 0, raw_frees = 0;
  std::map<void*, size_t> buffers;
  struct Ev {
    int device;
    StreamId stream;
    bool done;
  };
  std::map<uintptr_t, Ev> events;
  uintptr_t next_event = 1;
  int unrecordable_device = -1;  // record_event on this device fails: the backend waits
  size_t last_size = 0;

  void* raw_alloc(size_t n) override {
    if (in_use + n > capacity) return nullptr;
    void* p = std::malloc(n);
    buffers[p] = n;
    in_use += n;
    ++raw_allocs;
    return p;
  }
  void raw_free(void* p) override {
    in_use -= buffers.at(p);
    buffers.erase(p);
    ++raw_frees;
    std::free(p);
  }
  void* record_event(int device, StreamId s) override {
    if (device == unrecordable_device) return nullptr;
    events[next_event] = {device, s, false};
    return reinterpret_cast<void*>(next_event++);
  }
  bool event_done(void* e) override { return events.at(reinterpret_cast<uintptr_t>(e)).done; }
  void synchronize_event(void* e) override { events.at(reinterpret_cast<uintptr_t>(e)).done = true; }
  void release_event(void* e) override { events.erase(reinterpret_cast<uintptr_t>(e)); }
  void complete(int device, StreamId s) {
    for (auto& [k, e] : events)
      if (e.device == device && e.stream == s) e.done = true;
  }
};

}  // namespace

TEST(HostCache, RoundsToPowersOfTwo) {
  EXPECT_EQ(HostCache::round_size(1), 512u);
  EXPECT_EQ(HostCache::round_size(512), 512u);
  EXPECT_EQ(HostCache::round_size(513), 1024u);
  EXPECT_EQ(HostCache::round_size((size_t(3) << 20) + 1), size_t(4) << 20);
}

TEST(HostCache, ReusesFreedBuffersOfTheSameClass) {
  FakeHost be;
  HostCache cache(be);
  EXPECT_EQ(cache.allocate(0), nullptr);
  void* a = cache.allocate(3000);
  cache.free(a);
  void* b = cache.allocate(4096);  // same class (4096)
  EXPECT_EQ(b, a);
  void* c = cache.allocate(5000);  // 8192: a new buffer
  EXPECT_NE(c, a);
  EXPECT_EQ(be.raw_allocs, 2);
  auto s = cache.stats();
  EXPECT_EQ(s.allocated_bytes, 4096 + 8192);
  EXPECT_EQ(s.requested_bytes, 4096 + 5000);
  EXPECT_EQ(s.num_cache_hits, 1);
  cache.free(b);
  cache.free(c);
  EXPECT_THROW(cache.free(c), strata::Error);
  cache.empty_cache();
  EXPECT_EQ(be.in_use, 0u);
  EXPECT_EQ(cache.stats().reserved_bytes, 0);
}

TEST(HostCache, BufferUsedByAnAsyncCopyWaitsForItsStream) {
  FakeHost be;
  HostCache cache(be);
  char* a = static_cast<char*>(cache.allocate(10000));
  EXPECT_TRUE(cache.record_stream(a + 5000, 0, 7));  // any address inside the buffer
  EXPECT_TRUE(cache.record_stream(a, 1, 9));
  EXPECT_FALSE(cache.record_stream(a + 16384, 0, 7));  // past its end
  int on_stack = 0;
  EXPECT_FALSE(cache.record_stream(&on_stack, 0, 7));  // pageable memory: not ours
  cache.free(a);
  EXPECT_EQ(be.events.size(), 2u);
  EXPECT_EQ(cache.stats().num_pending_frees, 1);
  void* b = cache.allocate(10000);
  EXPECT_NE(b, a);  // the copies may still be running
  be.complete(0, 7);
  cache.free(b);
  void* c = cache.allocate(10000);
  EXPECT_EQ(c, b);  // a still waits for device 1's stream
  be.complete(1, 9);
  void* d = cache.allocate(10000);
  EXPECT_EQ(d, a);
  EXPECT_TRUE(be.events.empty());
  cache.free(c);
  cache.free(d);
}

TEST(HostCache, AStreamWhoseEventCannotBeRecordedHoldsNothingBack) {
  FakeHost be;
  be.unrecordable_device = 1;
  HostCache cache(be);
  void* a = cache.allocate(10000);
  EXPECT_TRUE(cache.record_stream(a, 1, 9));
  cache.free(a);
  EXPECT_TRUE(be.events.empty());
  EXPECT_EQ(cache.stats().num_pending_frees, 0);
  void* b = cache.allocate(10000);
  EXPECT_EQ(b, a);  // the backend waited for the stream: reusable at once
  EXPECT_TRUE(cache.record_stream(b, 1, 9));
  EXPECT_TRUE(cache.record_stream(b, 0, 7));
  cache.free(b);
  EXPECT_EQ(be.events.size(), 1u);
  EXPECT_EQ(cache.stats().num_pending_frees, 1);
  void* c = cache.allocate(10000);
  EXPECT_NE(c, a);
  be.complete(0, 7);
  cache.free(c);
  void* d = cache.allocate(10000);
  EXPECT_EQ(d, a);
  cache.free(d);
}

TEST(HostCache, OutOfMemoryEmptiesTheCacheThenRaises) {
  FakeHost be;
  be.capacity = 64 * 1024;
  HostCache cache(be);
  void* a = cache.allocate(32 * 1024);
  cache.record_stream(a, 0, 1);
  cache.free(a);                           // pending
  void* b = cache.allocate(64 * 1024);     // fails, waits for the event, frees a, succeeds
  EXPECT_EQ(be.raw_frees, 1);
  EXPECT_TRUE(be.events.empty());
  try {
    cache.allocate(1);
    FAIL() << "expected an out-of-memory error";
  } catch (const strata::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[pinned allocator] out of page-locked host memory allocating 1 bytes (rounded to 512)"),
              std::string::npos) << m;
    EXPECT_NE(m.find("65536 bytes in use"), std::string::npos) << m;
  }
  EXPECT_EQ(cache.stats().num_ooms, 1);
  cache.free(b);
}

TEST(HostCache, DestructorReturnsEverything) {
  FakeHost be;
  {
    HostCache cache(be);
    void* a = cache.allocate(100);
    cache.allocate(100000);  // still live at destruction
    cache.record_stream(a, 0, 3);
    cache.free(a);
  }
  EXPECT_TRUE(be.buffers.empty());
  EXPECT_TRUE(be.events.empty());
}
