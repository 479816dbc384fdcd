// DataLoader: coverage of every sample once per epoch, batch order independent of the worker
// count, drop_last, collation, exact mid-epoch resume, worker errors, bounded prefetch, and
// that abandoning or destroying a loader mid-epoch never hangs (a watchdog aborts if it does).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>

#include "testing.h"

namespace st = strata;
namespace sd = strata::data;

namespace {

// Aborts the test binary if the scope is not left within `seconds`: a hang fails loudly.
class Watchdog {
 public:
  explicit Watchdog(int seconds) : thread_([this, seconds] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
      std::fprintf(stderr, "watchdog: the DataLoader hung\n");
      std::abort();
    }
  }) {}
  ~Watchdog() {
    { std::lock_guard<std::mutex> lock(mutex_); done_ = true; }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Row i: input = (3 * i, 3 * i + 1, 3 * i + 2) as float, target = i.
std::shared_ptr<sd::TensorDataset> rows(int64_t n) {
  return std::make_shared<sd::TensorDataset>(st::arange(3 * n, st::TensorOptions(st::kFloat32)).view({n, 3}),
                                             st::arange(n));
}

// Wraps a dataset: sleeps a few index-dependent microseconds (so workers finish out of
// order), counts calls, and throws at `bad`.
class Tricky : public sd::Dataset<sd::Example> {
 public:
  Tricky(std::shared_ptr<sd::TensorDataset> inner, int64_t bad = -1, int sleep_us = 300)
      : inner_(std::move(inner)), bad_(bad), sleep_us_(sleep_us) {}
  int64_t size() const override { return inner_->size(); }
  sd::Example get(int64_t i) const override {
    calls++;
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds((i * 7919) % sleep_us_));
    if (i == bad_) throw std::runtime_error("disk on fire");
    return inner_->get(i);
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  std::shared_ptr<sd::TensorDataset> inner_;
  int64_t bad_;
  int sleep_us_;
};

std::vector<int64_t> targets_of(const sd::Example& b) {
  st::Tensor t = b.target.contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// One full pass, as copies of the batches.
std::vector<sd::Example> pass(sd::DataLoader<sd::Example>& loader) {
  std::vector<sd::Example> out;
  for (auto& b : loader) out.push_back(b);
  return out;
}

void expect_same_batches(const std::vector<sd::Example>& a, const std::vector<sd::Example>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(st::equal(a[k].input, b[k].input)) << "batch " << k;
    EXPECT_TRUE(st::equal(a[k].target, b[k].target)) << "batch " << k;
  }
}

}  // namespace

TEST(DataLoader, EverySampleOncePerEpochInSamplerOrder) {
  Watchdog dog(60);
  const int64_t n = 23;
  for (bool shuffle : {false, true}) {
    sd::DataLoader<sd::Example> loader(rows(n), {.batch_size = 4, .shuffle = shuffle, .num_workers = 2, .seed = 5});
    EXPECT_EQ(loader.size(), 6);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      EXPECT_EQ(loader.epoch(), epoch);
      std::vector<int64_t> seen;
      for (auto& b : loader) {
        auto t = targets_of(b);
        seen.insert(seen.end(), t.begin(), t.end());
      }
      auto want = shuffle ? sd::RandomSampler(n, 5).indices(epoch) : sd::SequentialSampler(n).indices(epoch);
      EXPECT_EQ(seen, want) << "epoch " << epoch;
    }
    EXPECT_EQ(loader.epoch(), 3);
  }
}

TEST(DataLoader, SameBatchesForEveryWorkerCount) {
  Watchdog dog(120);
  auto data = std::make_shared<Tricky>(rows(37));
  std::vector<std::vector<sd::Example>> runs;
  for (int64_t workers : {0, 1, 2, 4}) {
    sd::DataLoader<sd::Example> loader(data, {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 11});
    auto first = pass(loader), second = pass(loader);
    first.insert(first.end(), second.begin(), second.end());
    runs.push_back(first);
  }
  for (size_t r = 1; r < runs.size(); ++r) expect_same_batches(runs[0], runs[r]);
}

TEST(DataLoader, DropLastAndCollatedShapes) {
  for (bool drop : {false, true}) {
    sd::DataLoader<sd::Example> loader(rows(10), {.batch_size = 3, .drop_last = drop, .num_workers = 1});
    auto batches = pass(loader);
    ASSERT_EQ(batches.size(), drop ? 3u : 4u);
    EXPECT_EQ(batches[0].input.shape(), (st::Shape{3, 3}));
    EXPECT_EQ(batches[0].input.dtype(), st::kFloat32);
    EXPECT_EQ(batches[0].target.shape(), (st::Shape{3}));
    EXPECT_EQ(batches[0].target.dtype(), st::kInt64);
    EXPECT_EQ(st::testing::values(batches[1].input), (std::vector<double>{9, 10, 11, 12, 13, 14, 15, 16, 17}));
    if (!drop) EXPECT_EQ(batches[3].input.shape(), (st::Shape{1, 3}));
  }
}

TEST(DataLoader, VectorSamplesCustomCollateAndPinMemory) {
  auto list = std::make_shared<sd::TensorListDataset>(
      std::vector<st::Tensor>{st::arange(8).view({4, 2}), st::arange(4, st::TensorOptions(st::kFloat64))});
  sd::DataLoader<std::vector<st::Tensor>> loader(list, {.batch_size = 2, .pin_memory = true});
  int64_t k = 0;
  for (auto& b : loader) {
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0].shape(), (st::Shape{2, 2}));
    EXPECT_EQ(st::testing::values(b[1]), (std::vector<double>{double(2 * k), double(2 * k + 1)}));
    EXPECT_EQ(b[0].is_pinned(), st::cuda::is_available());
    ++k;
  }
  EXPECT_EQ(k, 2);
  // A user batch type: the sum of each batch's targets.
  sd::DataLoader<int64_t> sums(rows(6), {.batch_size = 4}, [](std::vector<sd::Example>&& s) {
    int64_t total = 0;
    for (auto& e : s) total += e.target.item<int64_t>();
    return total;
  });
  std::vector<int64_t> got;
  for (int64_t s : sums) got.push_back(s);
  EXPECT_EQ(got, (std::vector<int64_t>{0 + 1 + 2 + 3, 4 + 5}));
  EXPECT_THROW(sd::DataLoader<int64_t>(rows(6), {}), st::Error);  // no default collation to int64
  EXPECT_THROW(sd::DataLoader<sd::Example>(rows(6), {.batch_size = 0}), st::Error);
}

TEST(DataLoader, DistributedSamplerShards) {
  std::vector<int64_t> all;
  for (int64_t r = 0; r < 3; ++r) {
    auto sampler = std::make_shared<sd::DistributedSampler>(12, r, 3, sd::DistributedSamplerOptions{.seed = 2});
    sd::DataLoader<sd::Example> loader(rows(12), {.batch_size = 2, .num_workers = 1, .sampler = sampler});
    for (auto& b : loader) {
      auto t = targets_of(b);
      all.insert(all.end(), t.begin(), t.end());
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(12);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
}

TEST(DataLoader, MidEpochResumeGivesTheSameBatches) {
  Watchdog dog(120);
  auto data = std::make_shared<Tricky>(rows(29), -1, 100);
  sd::LoaderOptions opts{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 77};
  // Reference: three uninterrupted epochs.
  sd::DataLoader<sd::Example> reference(data, opts);
  std::vector<sd::Example> want;
  for (int e = 0; e < 3; ++e) {
    auto p = pass(reference);
    want.insert(want.end(), p.begin(), p.end());
  }
  const size_t per_epoch = 8;
  ASSERT_EQ(want.size(), 3 * per_epoch);
  for (size_t stop_after : {size_t{0}, size_t{3}, size_t{8}, size_t{11}, size_t{16}}) {
    // Interrupted run: deliver `stop_after` batches, checkpoint the state, drop the loader.
    std::map<std::string, int64_t> saved;
    std::vector<sd::Example> got;
    {
      sd::DataLoader<sd::Example> first(data, opts);
      while (got.size() < stop_after) {
        for (auto& b : first) {
          got.push_back(b);
          if (got.size() == stop_after || got.size() % per_epoch == 0) break;
        }
      }
      saved = first.state().to_map();
    }
    // Resumed run with another worker count, restored from the key/value form.
    sd::LoaderOptions other = opts;
    other.num_workers = 3;
    sd::DataLoader<sd::Example> second(data, other);
    second.load_state(sd::LoaderState::from_map(saved));
    while (got.size() < want.size()) {
      auto p = pass(second);
      ASSERT_FALSE(p.empty()) << "a resumed pass must not be empty";
      got.insert(got.end(), p.begin(), p.end());
    }
    SCOPED_TRACE("stopped after " + std::to_string(stop_after));
    expect_same_batches(got, want);
  }
}

TEST(DataLoader, WorkerErrorNamesTheSampleAndNeverHangs) {
  Watchdog dog(60);
  for (int64_t workers : {0, 1, 3}) {
    auto data = std::make_shared<Tricky>(rows(40), 13);
    auto loader = std::make_unique<sd::DataLoader<sd::Example>>(
        data, sd::LoaderOptions{.batch_size = 4, .num_workers = workers, .prefetch = 4});
    std::vector<int64_t> seen;
    try {
      for (auto& b : *loader) {
        auto t = targets_of(b);
        seen.insert(seen.end(), t.begin(), t.end());
      }
      FAIL() << "the error at sample 13 must reach the loop";
    } catch (const st::Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("sample 13"), std::string::npos) << what;
      EXPECT_NE(what.find("disk on fire"), std::string::npos) << what;
    }
    std::vector<int64_t> want(12);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want) << "the batches before the bad one arrive, in order, once";
    EXPECT_EQ(loader->state().batches, 3) << "the failed batch is not counted as delivered";
    loader.reset();  // joins the workers
  }
}

TEST(DataLoader, EarlyBreakAndDestructionDoNotHang) {
  Watchdog dog(60);
  auto data = std::make_shared<Tricky>(rows(200), -1, 2000);
  {
    sd::DataLoader<sd::Example> loader(data, {.batch_size = 2, .num_workers = 4, .prefetch = 3});
    int k = 0;
    for (auto& b : loader) {
      (void)b;
      if (++k == 2) break;
    }
    EXPECT_EQ(loader.state(), (sd::LoaderState{0, 2, 0}));
    // A new pass after a break starts the next epoch, complete.
    auto next = pass(loader);
    EXPECT_EQ(next.size(), 100u);
    EXPECT_EQ(loader.epoch(), 2);
    for (auto& b : loader) {  // destroyed with the workers busy mid-epoch
      (void)b;
      break;
    }
  }
  // Destroyed right after begin(), before any batch was consumed beyond the first.
  for (int i = 0; i < 5; ++i) {
    sd::DataLoader<sd::Example> loader(data, {.batch_size = 1, .num_workers = 2});
    auto it = loader.begin();
    (void)it;
  }
}

TEST(DataLoader, PrefetchIsBounded) {
  Watchdog dog(60);
  auto data = std::make_shared<Tricky>(rows(60), -1, 0);
  const int64_t bs = 3, workers = 2, prefetch = 1;
  sd::DataLoader<sd::Example> loader(data, {.batch_size = bs, .num_workers = workers, .prefetch = prefetch});
  int64_t delivered = 0;
  for (auto& b : loader) {
    (void)b;
    ++delivered;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the workers run ahead
    EXPECT_LE(data->calls.load(), (delivered + prefetch * workers) * bs) << "after batch " << delivered;
  }
  EXPECT_EQ(data->calls.load(), 60);
}
