// Private pools for graph capture (Note [Graph pools] in src/core/block_pool.h) against the
// fake device: routing by capture id, isolation from the ordinary pool both ways, holds by
// graphs, sharing between captures, and the return of the memory on release.
#include <gtest/gtest.h>

#include <strata/core/error.hpp>

#include "core/block_pool.h"
#include "fake_pool_backend.h"

using strata::detail::BlockPool;
using namespace strata_test;

namespace {
constexpr strata::detail::CaptureId kCap1 = 11, kCap2 = 12;
constexpr strata::detail::PoolId kPoolA = 1, kPoolB = 2;
}  // namespace

TEST(BlockPoolGraph, CaptureNeverReusesMemoryFreedOutsideIt) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* outside = pool.allocate(4 * KiB, kS1);
  pool.free(outside);  // cached in the ordinary pool, on the capture's stream
  pool.begin_capture(kCap1, kPoolA);
  void* inside = pool.allocate(4 * KiB, kS1, kCap1);
  EXPECT_NE(inside, outside);
  EXPECT_EQ(be.raw_allocs, 2);  // a segment of the graph pool's own
  EXPECT_EQ(pool.pool_reserved_bytes(kPoolA), int64_t(2 * MiB));
  // a non-capture allocation during the capture still reuses the ordinary cache
  void* eager = pool.allocate(4 * KiB, kS1);
  EXPECT_EQ(eager, outside);
  pool.free(eager);
  pool.free(inside);
  pool.end_capture(kCap1);
  pool.release_pool(kPoolA);
}

TEST(BlockPoolGraph, MemoryFreedInsideIsReusedOnlyByTheSameCapture) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  pool.begin_capture(kCap1, kPoolA);
  void* tmp = pool.allocate(8 * KiB, kS1, kCap1);
  pool.free(tmp);  // a temporary of the captured work
  void* again = pool.allocate(8 * KiB, kS1, kCap1);
  EXPECT_EQ(again, tmp);  // reused inside the capture: the graph's order makes that safe
  pool.free(again);
  pool.end_capture(kCap1);
  // the graph lives (holds kPoolA): its freed memory is not for ordinary allocations, which
  // would otherwise take its whole free segment by best fit
  void* e1 = pool.allocate(MiB, kS1);
  void* e2 = pool.allocate(MiB, kS1);  // e1 and e2 fill one new ordinary segment
  EXPECT_NE(e1, tmp);
  EXPECT_EQ(be.raw_allocs, 2);
  pool.release_pool(kPoolA);  // the graph is reset: its memory is anyone's now
  EXPECT_EQ(pool.pool_reserved_bytes(kPoolA), 0);
  void* after = pool.allocate(MiB, kS1);
  EXPECT_EQ(after, tmp);
  EXPECT_EQ(be.raw_allocs, 2);
  for (void* p : {after, e1, e2}) pool.free(p);
}

TEST(BlockPoolGraph, GraphsCapturedInOrderShareAPool) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  pool.begin_capture(kCap1, kPoolA);
  void* out1 = pool.allocate(64 * KiB, kS1, kCap1);
  void* tmp1 = pool.allocate(64 * KiB, kS1, kCap1);
  pool.free(tmp1);
  pool.end_capture(kCap1);
  pool.begin_capture(kCap2, kPoolA);  // the second graph replays after the first
  void* tmp2 = pool.allocate(64 * KiB, kS1, kCap2);
  EXPECT_EQ(tmp2, tmp1);
  EXPECT_EQ(be.raw_allocs, 1);
  pool.free(tmp2);
  pool.end_capture(kCap2);
  pool.release_pool(kPoolA);  // the first graph reset: the second still holds the pool
  EXPECT_EQ(pool.pool_reserved_bytes(kPoolA), int64_t(2 * MiB));
  EXPECT_NE(pool.allocate(64 * KiB, kS1), tmp1);
  pool.release_pool(kPoolA);
  EXPECT_EQ(pool.pool_reserved_bytes(kPoolA), 0);
  EXPECT_EQ(pool.stats().num_private_pools, 0);
  pool.free(out1);  // a static output outliving its graphs returns to the ordinary pool
  EXPECT_EQ(pool.stats().allocated_bytes, 512 * 128);
}

TEST(BlockPoolGraph, SeparatePoolsDoNotShare) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  pool.begin_capture(kCap1, kPoolA);
  void* a = pool.allocate(4 * KiB, kS1, kCap1);
  pool.free(a);
  pool.end_capture(kCap1);
  pool.begin_capture(kCap2, kPoolB);
  void* b = pool.allocate(4 * KiB, kS1, kCap2);
  EXPECT_NE(b, a);
  EXPECT_EQ(pool.stats().num_private_pools, 2);
  EXPECT_EQ(pool.stats().private_pool_bytes, int64_t(4 * MiB));
  pool.free(b);
  pool.end_capture(kCap2);
  pool.release_pool(kPoolA);
  pool.release_pool(kPoolB);
  EXPECT_EQ(pool.stats().private_pool_bytes, 0);
  EXPECT_EQ(pool.stats().reserved_bytes, int64_t(4 * MiB));  // cached, not released
}

TEST(BlockPoolGraph, NoEventWorkWhileCapturing) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* used = pool.allocate(4 * KiB, kS0);
  ASSERT_TRUE(pool.record_stream(used, kS2));
  pool.begin_capture(kCap1, kPoolA);
  pool.free(used);  // recording an event on kS2 now could break the capture: deferred
  EXPECT_TRUE(be.events.empty());
  EXPECT_EQ(pool.stats().num_pending_frees, 1);
  void* other = pool.allocate(512, kS0);  // the deferred block is neither reused nor merged
  EXPECT_NE(other, used);
  pool.free(other);
  EXPECT_THROW(pool.empty_cache(), strata::Error);  // cudaFree would wait for the device
  pool.end_capture(kCap1);
  EXPECT_EQ(be.events.size(), 1u);  // now the usual record_stream wait
  be.complete(kS2);
  EXPECT_EQ(pool.allocate(4 * KiB, kS0), used);
  pool.free(used);
  pool.release_pool(kPoolA);
}

TEST(BlockPoolGraph, GraphBlocksIgnoreRecordStream) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  pool.begin_capture(kCap1, kPoolA);
  void* a = pool.allocate(4 * KiB, kS1, kCap1);
  EXPECT_TRUE(pool.record_stream(a, kS2));
  pool.free(a);
  EXPECT_EQ(pool.stats().num_pending_frees, 0);
  EXPECT_EQ(pool.allocate(4 * KiB, kS1, kCap1), a);
  pool.free(a);
  pool.end_capture(kCap1);
  EXPECT_TRUE(be.events.empty());
  pool.release_pool(kPoolA);
}

TEST(BlockPoolGraph, OutOfMemoryDuringCaptureDoesNotReleaseTheCache) {
  FakeBackend be;
  be.capacity = 4 * MiB;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(4 * KiB, kS1);
  void* b = pool.allocate(4 * KiB, kS2);
  pool.free(a);
  pool.free(b);  // two cached whole segments fill the device
  pool.begin_capture(kCap1, kPoolA);
  EXPECT_THROW(pool.allocate(4 * KiB, kS1, kCap1), strata::Error);
  EXPECT_EQ(be.raw_frees, 0);
  pool.end_capture(kCap1);
  pool.release_pool(kPoolA);
  void* c = pool.allocate(4 * KiB, kS0);  // outside capture the retry frees the cache
  EXPECT_EQ(be.raw_frees, 2);
  pool.free(c);
}

TEST(BlockPoolGraph, BadUseRaises) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  EXPECT_THROW(pool.allocate(512, kS1, kCap1), strata::Error);  // a capture never begun
  EXPECT_THROW(pool.begin_capture(0, kPoolA), strata::Error);
  EXPECT_THROW(pool.end_capture(kCap1), strata::Error);
  EXPECT_THROW(pool.release_pool(kPoolA), strata::Error);
  pool.begin_capture(kCap1, kPoolA);
  EXPECT_THROW(pool.begin_capture(kCap1, kPoolB), strata::Error);
  EXPECT_TRUE(pool.capture_underway());
  pool.end_capture(kCap1);
  EXPECT_FALSE(pool.capture_underway());
  pool.release_pool(kPoolA);
  EXPECT_THROW(pool.release_pool(kPoolA), strata::Error);
}

TEST(BlockPoolGraph, DestroyingThePoolReturnsGraphSegments) {
  FakeBackend be;
  {
    BlockPool pool(be, "cuda:0");
    pool.begin_capture(kCap1, kPoolA);
    pool.allocate(4 * KiB, kS1, kCap1);
    void* t = pool.allocate(30 * MiB, kS1, kCap1);
    pool.free(t);
    pool.end_capture(kCap1);
  }
  EXPECT_EQ(be.in_use, 0u);
  EXPECT_EQ(be.raw_frees, be.raw_allocs);
}
