// The caching allocator's block management (src/core/block_pool.*) against a fake backend:
// real host memory for segments, events whose completion the test decides.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include <strata/core/error.hpp>

#include "core/block_pool.h"
#include "fake_pool_backend.h"

using strata::detail::BlockPool;
using strata::detail::PoolBackend;
using strata::detail::StreamId;

using namespace strata_test;

TEST(BlockPool, RoundingFollowsThePolicy) {
  EXPECT_EQ(BlockPool::round_size(1), 512u);
  EXPECT_EQ(BlockPool::round_size(512), 512u);
  EXPECT_EQ(BlockPool::round_size(513), 1024u);
  EXPECT_EQ(BlockPool::round_size(MiB + 1), MiB + 512);
  EXPECT_EQ(BlockPool::segment_size(512), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB + 512), 12 * MiB);
}

TEST(BlockPool, SmallBlocksShareASegmentAndAreReused) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  EXPECT_EQ(pool.allocate(0, kS0), nullptr);
  void* a = pool.allocate(100, kS0);
  void* b = pool.allocate(1000, kS0);
  EXPECT_EQ(be.raw_allocs, 1);  // both split from one 2 MiB segment
  EXPECT_EQ(as_char(b) - as_char(a), 512);
  auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 512 + 1024);
  EXPECT_EQ(s.requested_bytes, 1100);
  EXPECT_EQ(s.reserved_bytes, int64_t(2 * MiB));
  EXPECT_EQ(s.num_segments, 1);
  pool.free(a);
  void* c = pool.allocate(200, kS0);  // best fit: the 512-byte hole, not the big rest
  EXPECT_EQ(c, a);
  EXPECT_EQ(be.raw_allocs, 1);
  EXPECT_EQ(pool.stats().num_cache_hits, 2);  // b and c came from cached blocks
  pool.free(b);
  pool.free(c);
  EXPECT_THROW(pool.free(c), strata::Error);
}

TEST(BlockPool, FreedNeighboursCoalesceInAnyOrder) {
  const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const auto& order : orders) {
    FakeBackend be;
    BlockPool pool(be, "cuda:0");
    void* p[3];
    for (auto& q : p) q = pool.allocate(4 * MiB, kS0);  // three blocks of one 20 MiB segment
    ASSERT_EQ(be.raw_allocs, 1);
    pool.free(p[order[0]]);
    pool.free(p[order[1]]);
    EXPECT_GT(pool.stats().inactive_split_bytes, 0);
    pool.free(p[order[2]]);
    auto s = pool.stats();
    EXPECT_EQ(s.inactive_split_bytes, 0);  // one whole free segment again
    EXPECT_EQ(s.allocated_bytes, 0);
    void* big = pool.allocate(19 * MiB, kS0);  // only fits in the merged block
    EXPECT_EQ(big, p[0]);
    EXPECT_EQ(be.raw_allocs, 1);
    pool.free(big);
  }
}

TEST(BlockPool, LargeBlockKeepsSmallRemainderInsteadOfSplitting) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(11 * MiB, kS0);  // 12 MiB segment, 1 MiB rest: not split
  auto s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, int64_t(12 * MiB));
  EXPECT_EQ(s.allocated_bytes, int64_t(12 * MiB));
  pool.free(a);
}

TEST(BlockPool, StreamsHaveSeparatePools) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(4 * KiB, kS0);
  pool.free(a);
  void* b = pool.allocate(4 * KiB, kS1);  // the cached block belongs to stream 0
  EXPECT_NE(b, a);
  EXPECT_EQ(be.raw_allocs, 2);
  void* c = pool.allocate(4 * KiB, kS0);
  EXPECT_EQ(c, a);
  pool.free(b);
  pool.free(c);
}

TEST(BlockPool, RecordStreamDefersReuseUntilEventsComplete) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(64 * KiB, kS0);
  EXPECT_TRUE(pool.record_stream(a, kS1));
  EXPECT_TRUE(pool.record_stream(a, kS2));
  EXPECT_TRUE(pool.record_stream(a, kS0));  // its own stream: nothing to wait for
  EXPECT_FALSE(pool.record_stream(as_char(a) + 512, kS1));
  pool.free(a);
  EXPECT_EQ(be.events.size(), 2u);  // one per other stream
  EXPECT_EQ(pool.stats().num_pending_frees, 1);
  void* b = pool.allocate(64 * KiB, kS0);
  EXPECT_NE(b, a);  // streams 1 and 2 may still use a
  pool.free(b);
  be.complete(kS1);
  void* c = pool.allocate(64 * KiB, kS0);
  EXPECT_NE(c, a);  // stream 2 still pending
  pool.free(c);
  be.complete(kS2);
  void* d = pool.allocate(64 * KiB, kS0);
  EXPECT_EQ(d, a);  // both events done: a is reusable (and merged with its neighbours)
  EXPECT_EQ(pool.stats().num_pending_frees, 0);
  EXPECT_TRUE(be.events.empty());
  pool.free(d);
}

// A free runs in destructors, so recording cannot raise: a backend that could not record waited
// for the stream instead (nullptr), and the block needs to wait only for the others.
TEST(BlockPool, AStreamWhoseEventCannotBeRecordedHoldsNothingBack) {
  FakeBackend be;
  be.unrecordable = kS1;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(64 * KiB, kS0);
  EXPECT_TRUE(pool.record_stream(a, kS1));
  pool.free(a);
  EXPECT_TRUE(be.events.empty());
  EXPECT_EQ(pool.stats().num_pending_frees, 0);
  void* b = pool.allocate(64 * KiB, kS0);
  EXPECT_EQ(b, a);  // reusable at once
  EXPECT_TRUE(pool.record_stream(b, kS1));
  EXPECT_TRUE(pool.record_stream(b, kS2));
  pool.free(b);
  EXPECT_EQ(be.events.size(), 1u);  // stream 2's only
  EXPECT_EQ(pool.stats().num_pending_frees, 1);
  void* c = pool.allocate(64 * KiB, kS0);
  EXPECT_NE(c, a);
  be.complete(kS2);
  pool.free(c);
  void* d = pool.allocate(64 * KiB, kS0);
  EXPECT_EQ(d, a);
  EXPECT_EQ(pool.stats().num_pending_frees, 0);
  pool.free(d);
}

TEST(BlockPool, EmptyCacheReleasesOnlyWholeFreeSegments) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(KiB, kS0);
  void* b = pool.allocate(KiB, kS0);
  void* big = pool.allocate(30 * MiB, kS0);
  pool.free(a);
  pool.free(big);
  pool.empty_cache();  // the 30 MiB segment goes; the small one still holds b
  auto s = pool.stats();
  EXPECT_EQ(be.raw_frees, 1);
  EXPECT_EQ(s.reserved_bytes, int64_t(2 * MiB));
  EXPECT_EQ(s.num_segments, 1);
  EXPECT_EQ(s.inactive_split_bytes, int64_t(2 * MiB - 1024));  // a's block merged with the rest
  EXPECT_NEAR(s.fragmentation, double(2 * MiB - 1024) / double(2 * MiB), 1e-12);
  pool.free(b);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  EXPECT_EQ(be.in_use, 0u);
}

TEST(BlockPool, StatsAndPeak) {
  FakeBackend be;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(3 * MiB, kS0);
  void* b = pool.allocate(5 * MiB, kS0);
  pool.free(a);
  void* c = pool.allocate(KiB, kS0);
  auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, int64_t(5 * MiB + KiB));
  EXPECT_EQ(s.peak_allocated_bytes, int64_t(8 * MiB));
  EXPECT_EQ(s.reserved_bytes, int64_t(22 * MiB));
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.num_raw_allocs, 2);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, int64_t(5 * MiB + KiB));
  pool.free(b);
  pool.free(c);
}

TEST(BlockPool, OutOfMemoryReleasesCacheRetriesThenRaises) {
  FakeBackend be;
  be.capacity = 40 * MiB;
  BlockPool pool(be, "cuda:3");
  void* a = pool.allocate(30 * MiB, kS0);
  pool.free(a);                           // cached, 30 MiB reserved
  void* b = pool.allocate(32 * MiB, kS0);  // fails, releases the cached 30 MiB, succeeds
  EXPECT_EQ(be.failed_allocs, 1);
  EXPECT_EQ(be.raw_frees, 1);
  void* c = pool.allocate(KiB, kS0);  // 2 MiB segment still fits
  try {
    pool.allocate(20 * MiB, kS0);
    FAIL() << "expected an out-of-memory error";
  } catch (const strata::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[cuda allocator] out of memory on cuda:3 allocating 20971520 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("32.00 MiB allocated"), std::string::npos) << m;
    EXPECT_NE(m.find("34.00 MiB reserved in 2 segments"), std::string::npos) << m;
    EXPECT_NE(m.find("fake device full"), std::string::npos) << m;
  }
  EXPECT_EQ(be.failed_allocs, 3);  // first try and the retry after releasing the cache
  EXPECT_EQ(pool.stats().num_ooms, 1);
  EXPECT_EQ(pool.stats().allocated_bytes, int64_t(32 * MiB + KiB));  // nothing leaked
  pool.free(b);
  pool.free(c);
}

TEST(BlockPool, OutOfMemoryWaitsForPendingFrees) {
  FakeBackend be;
  be.capacity = 24 * MiB;
  BlockPool pool(be, "cuda:0");
  void* a = pool.allocate(20 * MiB, kS0);
  pool.record_stream(a, kS1);
  pool.free(a);                           // pending on stream 1
  void* b = pool.allocate(20 * MiB, kS0);  // OOM -> wait for the event, release a's segment, retry
  EXPECT_EQ(be.failed_allocs, 1);
  EXPECT_EQ(be.raw_frees, 1);
  EXPECT_TRUE(be.events.empty());
  EXPECT_EQ(pool.stats().num_pending_frees, 0);
  pool.free(b);
}

// Random allocate/free/record_stream/empty_cache against a model of the live blocks.
TEST(BlockPool, RandomizedAgainstAModel) {
  FakeBackend be;
  be.capacity = 256 * MiB;
  {
    BlockPool pool(be, "cuda:0");
    std::mt19937_64 rng(1234);
    struct Live {
      size_t n;
      StreamId stream;
      unsigned char tag;
    };
    std::map<char*, Live> live;
    const StreamId streams[3] = {kS0, kS1, kS2};
    int64_t requested = 0;
    for (int step = 0; step < 20000; ++step) {
      int op = static_cast<int>(rng() % 10);
      if (op < 5 || live.empty()) {
        size_t n = rng() % 4 == 0 ? 1 + rng() % (24 * MiB) : 1 + rng() % (64 * KiB);
        StreamId s = streams[rng() % 3];
        char* p;
        try {
          p = as_char(pool.allocate(n, s));
        } catch (const strata::Error&) {
          continue;  // the fake device is full: fine, the model is unchanged
        }
        // no overlap with any live block
        auto next = live.lower_bound(p);
        if (next != live.end()) ASSERT_LE(p + n, next->first);
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second.n, p);
        }
        unsigned char tag = static_cast<unsigned char>(rng());
        std::memset(p, tag, n < 4096 ? n : 4096);
        live[p] = {n, s, tag};
        requested += static_cast<int64_t>(n);
      } else if (op < 9) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        size_t check = it->second.n < 4096 ? it->second.n : 4096;
        for (size_t i = 0; i < check; ++i) ASSERT_EQ(static_cast<unsigned char>(it->first[i]), it->second.tag);
        if (rng() % 3 == 0) pool.record_stream(it->first, streams[rng() % 3]);
        requested -= static_cast<int64_t>(it->second.n);
        pool.free(it->first);
        live.erase(it);
      } else if (rng() % 4 == 0) {
        be.complete(streams[rng() % 3]);
      } else if (rng() % 20 == 0) {
        pool.empty_cache();
      }
      auto s = pool.stats();
      int64_t rounded = 0;
      for (auto& [p, l] : live) rounded += static_cast<int64_t>(BlockPool::round_size(l.n));
      ASSERT_EQ(s.requested_bytes, requested);
      ASSERT_GE(s.allocated_bytes, rounded);  // unsplit slack is counted in the block
      ASSERT_LE(s.allocated_bytes, s.reserved_bytes);
      ASSERT_EQ(s.reserved_bytes, static_cast<int64_t>(be.in_use));
      ASSERT_EQ(s.num_segments, static_cast<int64_t>(be.segments.size()));
    }
    auto mid = pool.stats();  // the run went through every path
    EXPECT_GT(mid.num_cache_hits, 1000);
    EXPECT_GT(mid.num_raw_frees, 0);
    EXPECT_GT(mid.num_ooms, 0);
    EXPECT_GT(be.failed_allocs, mid.num_ooms);  // some failures were rescued by the retry
    for (auto& [p, l] : live) pool.free(p);
    auto s = pool.stats();
    EXPECT_EQ(s.allocated_bytes, 0);
    EXPECT_EQ(s.requested_bytes, 0);
    pool.empty_cache();
    EXPECT_EQ(pool.stats().reserved_bytes, 0);
    EXPECT_EQ(be.in_use, 0u);
    EXPECT_TRUE(be.events.empty());
  }
  EXPECT_TRUE(be.segments.empty());
}

// Threads allocating and freeing at once (each on its own stream, as threads with their own
// current streams do): no block is handed out twice, and everything comes back.
TEST(BlockPool, ConcurrentThreadsNeverShareABlock) {
  FakeBackend be;
  {
    BlockPool pool(be, "cuda:0");
    std::vector<std::thread> threads;
    std::atomic<int> corrupted{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        std::vector<std::pair<unsigned char*, size_t>> mine;
        const unsigned char tag = static_cast<unsigned char>(t + 1);
        for (int i = 0; i < 4000; ++i) {
          if (mine.size() < 16 && rng() % 2) {
            size_t n = 1 + rng() % (2 * MiB);
            auto* p = static_cast<unsigned char*>(pool.allocate(n, StreamId(t)));
            std::memset(p, tag, n);
            mine.emplace_back(p, n);
          } else if (!mine.empty()) {
            auto [p, n] = mine.back();
            mine.pop_back();
            for (size_t k = 0; k < n; k += 97)
              if (p[k] != tag) ++corrupted;
            pool.free(p);
          }
        }
        for (auto [p, n] : mine) pool.free(p);
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(corrupted.load(), 0);
    EXPECT_EQ(pool.stats().allocated_bytes, 0);
    EXPECT_EQ(pool.stats().num_allocs, pool.stats().num_frees);
  }
  EXPECT_TRUE(be.segments.empty());  // the pool's destructor returned every segment
}
