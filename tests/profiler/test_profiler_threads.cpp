// The profiler with several threads: user threads and DataLoader workers recorded on their own
// thread numbers, and sessions that start and stop while other threads run ops.
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "profiler/profiler_testing.h"
#include "testing.h"

using namespace profiler_testing;

TEST(Profiler, OpsFromSeveralThreads) {
  Tensor x = st::randn({16, 16});
  prof::Profiler p;
  const int per_thread[2] = {3, 5};
  {
    prof::ProfileScope scope(p);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        STRATA_RECORD_FUNCTION(t == 0 ? "worker0" : "worker1");
        for (int i = 0; i < per_thread[t]; ++i) st::exp(x);
      });
    for (auto& th : threads) th.join();
  }
  const auto& w0 = only(p, "worker0");
  const auto& w1 = only(p, "worker1");
  EXPECT_NE(w0.thread_id, w1.thread_id);
  std::map<int64_t, int> exps;
  for (const auto* e : named(p, "exp")) {
    ++exps[e->thread_id];
    EXPECT_EQ(e->parent_id, e->thread_id == w0.thread_id ? w0.id : w1.id);
  }
  EXPECT_EQ(exps.size(), 2u);
  EXPECT_EQ(exps[w0.thread_id], per_thread[0]);
  EXPECT_EQ(exps[w1.thread_id], per_thread[1]);
}

// Sessions start and stop while other threads run ops and ranges without pause: each trace
// is well formed (every parent is in the trace on the same thread, children inside it), and
// nothing crashes when ops straddle a stop or a start.
TEST(Profiler, SessionsComeAndGoWhileThreadsRunOps) {
  Tensor x = st::randn({8, 8});
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&] {
      while (!done.load()) {
        STRATA_RECORD_FUNCTION("work");
        run_composite(st::exp(x));
      }
    });
  for (int round = 0; round < 30; ++round) {
    prof::Profiler p({.record_shapes = round % 2 == 0, .profile_memory = round % 3 == 0});
    p.start();
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    p.stop();
    std::map<int64_t, const prof::ProfilerEvent*> by_id;
    for (const auto& e : p.events()) by_id[e.id] = &e;
    for (const auto& e : p.events()) {
      EXPECT_GE(e.self_ns, 0);
      if (e.parent_id < 0) continue;
      auto parent = by_id.find(e.parent_id);
      if (parent == by_id.end()) continue;  // opened before the start: not in this trace
      EXPECT_EQ(parent->second->thread_id, e.thread_id);
      EXPECT_LE(parent->second->start_ns, e.start_ns);
      EXPECT_GE(parent->second->end_ns, e.end_ns);
    }
  }
  done = true;
  for (auto& th : threads) th.join();
}

TEST(Profiler, ThreadsThatExitBeforeStopKeepTheirEvents) {
  // each thread's buffer outlives the thread: the session holds it until stop() reads it
  Tensor x = st::randn({16});
  prof::Profiler p;
  p.start();
  for (int i = 0; i < 4; ++i) std::thread([&] {
      STRATA_RECORD_FUNCTION("short_lived");
      st::exp(x);
    }).join();
  p.stop();
  const auto ranges = named(p, "short_lived");
  ASSERT_EQ(ranges.size(), 4u);
  std::set<int64_t> threads;
  for (const auto* r : ranges) {
    threads.insert(r->thread_id);
    const auto kids = children(p, *r);
    ASSERT_EQ(kids.size(), 1u);
    EXPECT_EQ(kids[0]->name, "exp");
  }
  EXPECT_EQ(threads.size(), 4u);
}

TEST(Profiler, ARangeOpenedInOneSessionAndClosedInTheNextIsLeftOut) {
  Tensor x = st::randn({16});
  prof::Profiler first, second;
  std::optional<prof::RecordFunction> range;
  first.start();
  range.emplace("old");
  st::exp(x);
  first.stop();
  second.start();
  st::exp(x);
  range.reset();  // closes in the first session's buffer, which nobody reads any more
  st::exp(x);
  second.stop();
  ASSERT_EQ(named(second, "exp").size(), 2u);
  EXPECT_TRUE(named(second, "old").empty());
  for (const auto* e : named(second, "exp")) EXPECT_EQ(e->depth, 0);
  EXPECT_EQ(named(first, "exp").size(), 1u);  // the range never closed in the first session
  EXPECT_TRUE(named(first, "old").empty());
}

namespace {

// Samples made by ops inside a range, on the DataLoader's worker threads.
class OpsDataset final : public st::data::Dataset<st::data::Example> {
 public:
  int64_t size() const override { return 8; }
  st::data::Example get(int64_t index) const override {
    STRATA_RECORD_FUNCTION("get");
    return {st::exp(st::full({4}, double(index))), st::zeros({1})};
  }
};

}  // namespace

TEST(Profiler, DataLoaderWorkersAreRecordedOnTheirThreads) {
  st::data::DataLoader<st::data::Example> loader(std::make_shared<OpsDataset>(),
                                                 {.batch_size = 2, .num_workers = 2});
  prof::Profiler p;
  {
    prof::ProfileScope scope(p);
    STRATA_RECORD_FUNCTION("main");
    for (const auto& batch : loader) EXPECT_EQ(batch.input.size(0), 2);
  }
  const int64_t main_thread = only(p, "main").thread_id;
  const auto gets = named(p, "get");
  ASSERT_EQ(gets.size(), 8u);
  for (const auto* g : gets) {
    EXPECT_NE(g->thread_id, main_thread);
    std::vector<std::string> kids;
    for (const auto* c : children(p, *g)) {
      kids.push_back(c->name);
      EXPECT_EQ(c->thread_id, g->thread_id);
    }
    EXPECT_EQ(kids, (std::vector<std::string>{"fill", "exp", "fill"}));
  }
}
