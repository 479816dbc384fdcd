// DataLoader: coverage of every sample once per epoch, batch order independent of the worker
// count, drop_last, collation, exact mid-epoch resume, worker errors, bounded prefetch, and
// that abandoning or destroying a loader mid-epoch never hangs (a watchdog aborts if it does);
// then bad input: sizes and epochs at the int64 limits, workers the system cannot start, a
// moved-from loader, states from another loader, and collate functions throwing anything.
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

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
  // samples of different lengths raise, even when the first has no tensors
  std::vector<std::vector<st::Tensor>> uneven = {{}, {st::ones({2}), st::ones({2})}};
  EXPECT_TRUE(st::testing::throws_with([&] { sd::default_collate(std::move(uneven)); },
                                       {"[default_collate] sample 1 has 2 tensors, sample 0 has 0"}));
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
    // Interrupted run: deliver `stop_after` batches, checkpoint the state, drop the loader. The
    // checkpoint is taken inside the loop: once a pass is left, the loader moves on to the next
    // epoch (AbandonedPassStateIsWhatTheLoaderDoesNext).
    std::vector<sd::Example> got;
    std::map<std::string, int64_t> saved;
    {
      sd::DataLoader<sd::Example> first(data, opts);
      saved = first.state().to_map();
      while (got.size() < stop_after) {
        for (auto& b : first) {
          got.push_back(b);
          if (got.size() == stop_after) saved = first.state().to_map();
          if (got.size() == stop_after || got.size() % per_epoch == 0) break;
        }
      }
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
    ASSERT_TRUE(st::testing::throws_with(
        [&] {
          for (auto& b : *loader) {
            auto t = targets_of(b);
            seen.insert(seen.end(), t.begin(), t.end());
          }
        },
        {"sample 13", "disk on fire"}))
        << "the error at sample 13 must reach the loop";
    std::vector<int64_t> want(12);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want) << "the batches before the bad one arrive, in order, once";
    // The failed pass is over: the next one, and the state, start the next epoch.
    EXPECT_EQ(loader->state().epoch, 1);
    EXPECT_EQ(loader->state().batches, 0);
    loader.reset();  // joins the workers
  }
}

// Each pass tells the dataset its epoch through Dataset::set_epoch, before any get() of the
// pass: restored mid-epoch it is the restored epoch. A set_epoch of the dataset's own that
// overrides nothing (another parameter type) is not called.
TEST(DataLoader, TellsTheDatasetEachPassEpoch) {
  struct Epochs : sd::Dataset<st::Tensor> {
    int64_t size() const override { return 6; }
    st::Tensor get(int64_t i) const override { return st::scalar_tensor(static_cast<double>(i * 100 + epoch)); }
    void set_epoch(int64_t e) override { heard.push_back(epoch = e); }
    std::vector<int64_t> heard;
    int64_t epoch = -1;
  };
  auto data = std::make_shared<Epochs>();
  sd::DataLoader<st::Tensor> loader(data, {.batch_size = 2, .num_workers = 2});
  std::vector<double> seen;
  for (int e = 0; e < 2; ++e)
    for (auto& b : loader) seen.push_back(b.select(0, 0).item<double>());
  EXPECT_EQ(data->heard, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(seen, (std::vector<double>{0, 200, 400, 1, 201, 401}));
  sd::LoaderState mid{.epoch = 7, .batches = 1, .seed = 0};
  loader.load_state(mid);
  for (auto& b : loader) seen.push_back(b.select(0, 0).item<double>());
  EXPECT_EQ(data->heard.back(), 7);
  EXPECT_EQ(seen.back(), 407);

  struct OwnSetEpoch : sd::Dataset<st::Tensor> {
    int64_t size() const override { return 2; }
    st::Tensor get(int64_t i) const override { return st::scalar_tensor(static_cast<double>(i)); }
    void set_epoch(double) { called = true; }  // hides the virtual, overrides nothing
    bool called = false;
  };
  auto own = std::make_shared<OwnSetEpoch>();
  sd::DataLoader<st::Tensor> plain(own, {.batch_size = 2});
  for (auto& b : plain) (void)b;
  EXPECT_FALSE(own->called);
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
    EXPECT_EQ(loader.state().epoch, 1) << "the abandoned epoch is over";
    EXPECT_EQ(loader.state().batches, 0);
    EXPECT_EQ(loader.epoch(), 1);
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

namespace {

// A batch that counts how many of its kind exist; a moved-from one no longer counts, so a
// batch moved into place is counted once throughout.
struct Counted {
  static inline std::atomic<int64_t> alive{0};
  bool counts = true;
  Counted() { ++alive; }
  Counted(const Counted&) { ++alive; }
  Counted(Counted&& other) noexcept { other.counts = false; }
  Counted& operator=(const Counted&) = delete;
  ~Counted() {
    if (counts) --alive;
  }
};

int64_t threads_of_this_process() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoll(line.substr(8));
  return -1;
}

// The thread count once it reads `expected`, or what it reads after 10 s: a joined thread
// leaves the count a moment after its join returns.
int64_t threads_settled_at(int64_t expected) {
  int64_t n = threads_of_this_process();
  for (int i = 0; i < 10000 && n != expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = threads_of_this_process();
  }
  return n;
}

// The thread count once two reads 20 ms apart agree (threads of earlier tests may still be
// leaving).
int64_t steady_thread_count() {
  int64_t n = threads_of_this_process();
  for (int i = 0; i < 500; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t again = threads_of_this_process();
    if (again == n) break;
    n = again;
  }
  return n;
}

}  // namespace

// Leaving a loop early stops the pass's workers and frees the batches they made ahead as
// soon as its iterators are gone, not at the next pass or the loader's destruction.
TEST(DataLoader, LeftPassStopsItsWorkersAndFreesItsBatches) {
  Watchdog dog(60);
  const int64_t threads_before = steady_thread_count();
  ASSERT_GT(threads_before, 0);
  auto data = std::make_shared<Tricky>(rows(400), -1, 0);
  sd::DataLoader<Counted> loader(data, {.batch_size = 2, .num_workers = 3, .prefetch = 4},
                                 [](std::vector<sd::Example>&&) { return Counted(); });
  for (auto& b : loader) {
    (void)b;
    // the workers fill their window: 3 x 4 batches ahead of this one
    for (int i = 0; i < 2000 && Counted::alive.load() < 13; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(Counted::alive.load(), 13);
    EXPECT_EQ(threads_of_this_process(), threads_before + 3);
    break;
  }
  EXPECT_EQ(Counted::alive.load(), 0);
  EXPECT_EQ(threads_settled_at(threads_before), threads_before);
  EXPECT_EQ(loader.state().epoch, 1);
  // An iterator kept past the loop keeps the pass, and its workers, alive.
  {
    auto it = loader.begin();
    EXPECT_EQ(threads_of_this_process(), threads_before + 3);
    ++it;
    EXPECT_EQ(loader.state().batches, 2);
  }
  EXPECT_EQ(threads_settled_at(threads_before), threads_before);
  EXPECT_EQ(Counted::alive.load(), 0);
  // A pass replaced by a new one while its iterator lives: releasing that iterator later
  // leaves the new pass's workers running.
  auto old_pass = loader.begin();
  auto new_pass = loader.begin();
  old_pass = {};
  int64_t n = 1;
  for (++new_pass; new_pass != std::default_sentinel; ++new_pass) ++n;
  EXPECT_EQ(n, 200);
  EXPECT_EQ(loader.state().epoch, 4);
}

// An iterator released on another thread stops the pass's workers there; a loader destroyed
// meanwhile must wait for that join, since the workers still read the loader and the dataset.
TEST(DataLoader, IteratorReleasedOnAnotherThreadWhileTheLoaderGoes) {
  Watchdog dog(60);
  struct Slow : sd::Dataset<sd::Example> {
    std::shared_ptr<sd::TensorDataset> inner = rows(8);
    std::atomic<int>* in_get;
    explicit Slow(std::atomic<int>* counter) : in_get(counter) {}
    int64_t size() const override { return inner->size(); }
    sd::Example get(int64_t i) const override {
      ++*in_get;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      sd::Example e = inner->get(i);
      --*in_get;
      return e;
    }
  };
  std::atomic<int> in_get{0};
  auto loader = std::make_unique<sd::DataLoader<sd::Example>>(std::make_shared<Slow>(&in_get),
                                                              sd::LoaderOptions{.batch_size = 1, .num_workers = 2});
  auto it = loader->begin();  // the workers are on to the next batches, 200 ms each
  std::thread release([it = std::move(it)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    it = {};  // halts the pass: joins workers that are inside get()
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  loader.reset();
  EXPECT_EQ(in_get.load(), 0);  // no worker outlives the loader
  release.join();
}

// One pass is live at a time: an iterator of a pass that a later begin() abandoned raises when
// advanced (it had gone on taking the new pass's batches, or with workers waited forever on a
// pass whose workers had stopped), and the new pass is whole.
TEST(DataLoader, IteratorOfAnAbandonedPassRaises) {
  Watchdog dog(60);
  for (int workers : {0, 2}) {
    SCOPED_TRACE(workers);
    auto data = std::make_shared<Tricky>(rows(8), -1, 0);
    sd::DataLoader<sd::Example> loader(data, {.batch_size = 2, .shuffle = true, .num_workers = workers, .seed = 1});
    auto a = loader.begin();
    auto b = loader.begin();
    EXPECT_TRUE(st::testing::throws_with([&] { ++a; }, {"[DataLoader]", "abandoned", "new pass"}));
    std::vector<int64_t> seen = targets_of(*b);
    for (++b; b != std::default_sentinel; ++b)
      for (int64_t t : targets_of(*b)) seen.push_back(t);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    // peeking at a batch inside the loop starts a pass of its own: the loop then raises
    EXPECT_THROW(
        {
          for (auto& batch : loader) {
            (void)batch;
            auto peek = *loader.begin();
          }
        },
        st::Error);
  }
}

// A dataset whose first get() waits until released, to hold a thread inside a pass.
class Gate : public sd::Dataset<sd::Example> {
 public:
  int64_t size() const override { return 4; }
  sd::Example get(int64_t i) const override {
    if (i == 0 && !entered.exchange(true))
      while (!released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return {st::full({1}, static_cast<double>(i)), st::full({1}, static_cast<double>(i), st::kInt64)};
  }
  mutable std::atomic<bool> entered{false}, released{false};
};

// Two threads in one loader's passes at once raise rather than race (they had deadlocked).
TEST(DataLoader, TwoThreadsAtOnceRaise) {
  Watchdog dog(60);
  auto gate = std::make_shared<Gate>();
  sd::DataLoader<sd::Example> loader(gate, {.batch_size = 1});
  int64_t batches = 0;
  std::thread first([&] {
    for (auto& b : loader) {
      (void)b;
      ++batches;
    }
  });
  while (!gate->entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(st::testing::throws_with([&] { loader.begin(); }, {"[DataLoader]", "two threads"}));
  gate->released = true;
  first.join();
  EXPECT_EQ(batches, 4);
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

namespace {

// Rows of `rows(n)` as std::vector<Tensor> samples.
std::shared_ptr<sd::TensorListDataset> list_rows(int64_t n) {
  return std::make_shared<sd::TensorListDataset>(
      std::vector<st::Tensor>{st::arange(3 * n, st::TensorOptions(st::kFloat32)).view({n, 3}), st::arange(n)});
}

std::vector<std::vector<st::Tensor>> list_pass(sd::DataLoader<std::vector<st::Tensor>>& loader) {
  std::vector<std::vector<st::Tensor>> out;
  for (auto& b : loader) out.push_back(b);
  return out;
}

void expect_same_lists(const std::vector<std::vector<st::Tensor>>& a, const std::vector<std::vector<st::Tensor>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].size(), b[k].size());
    for (size_t j = 0; j < a[k].size(); ++j) EXPECT_TRUE(st::equal(a[k][j], b[k][j])) << "batch " << k;
  }
}

// Fails at sample `bad` the first time only.
class FailsOnce : public sd::Dataset<sd::Example> {
 public:
  FailsOnce(std::shared_ptr<sd::TensorDataset> inner, int64_t bad) : inner_(std::move(inner)), bad_(bad) {}
  int64_t size() const override { return inner_->size(); }
  sd::Example get(int64_t i) const override {
    if (i == bad_ && !failed_.exchange(true)) throw std::runtime_error("transient");
    return inner_->get(i);
  }

 private:
  std::shared_ptr<sd::TensorDataset> inner_;
  int64_t bad_;
  mutable std::atomic<bool> failed_{false};
};

}  // namespace

TEST(DataLoaderBadInput, BatchSizeNearInt64Max) {
  for (int64_t bs : {INT64_MAX, INT64_MAX - 1, int64_t{1} << 62}) {
    sd::DataLoader<sd::Example> loader(rows(8), {.batch_size = bs, .num_workers = 1});
    ASSERT_EQ(loader.size(), 1);
    auto batches = pass(loader);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(targets_of(batches[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    sd::DataLoader<sd::Example> dropped(rows(8), {.batch_size = bs, .drop_last = true});
    EXPECT_EQ(dropped.size(), 0);
    EXPECT_TRUE(pass(dropped).empty());
  }
}

TEST(DataLoaderBadInput, HugePrefetchMeansNoBound) {
  Watchdog dog(60);
  for (int64_t prefetch : {int64_t{1} << 62, INT64_MAX}) {
    sd::DataLoader<sd::Example> loader(rows(20), {.batch_size = 2, .num_workers = 2, .prefetch = prefetch});
    std::vector<int64_t> seen;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (auto& b : loader) {
        auto t = targets_of(b);
        seen.insert(seen.end(), t.begin(), t.end());
      }
    std::vector<int64_t> want(20);
    std::iota(want.begin(), want.end(), 0);
    want.insert(want.end(), want.begin(), want.end());
    EXPECT_EQ(seen, want) << "prefetch " << prefetch;
  }
}

TEST(DataLoaderBadInput, WorkersTheSystemCannotStart) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer reserves more address space than the limit this test sets";
#elif !defined(__linux__)
  GTEST_SKIP() << "reads the address space size from /proc";
#else
  Watchdog dog(120);
  sd::DataLoader<sd::Example> loader(rows(512), {.batch_size = 1, .num_workers = 256});
  // Leave room for a few thread stacks (8 MiB each by default) only, so that most of the 256
  // workers cannot start.
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  ASSERT_GT(pages, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_max, static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (48 << 20));
  ASSERT_EQ(setrlimit(RLIMIT_AS, &low), 0);
  // Checked once the limit is restored: reporting a failure allocates.
  const ::testing::AssertionResult refused = st::testing::throws_with(
      [&] { (void)loader.begin(); }, {"could not start worker thread", "num_workers = 256"});
  ASSERT_EQ(setrlimit(RLIMIT_AS, &old), 0);
  EXPECT_TRUE(refused);
  // The threads that started were joined; the failed pass did not start, so the next one (with
  // threads to spare now) is the whole of epoch 0.
  EXPECT_EQ(loader.state().epoch, 0);
  EXPECT_EQ(loader.state().batches, 0);
  auto batches = pass(loader);
  ASSERT_EQ(batches.size(), 512u);
  for (int64_t k = 0; k < 512; ++k) EXPECT_EQ(targets_of(batches[k]), (std::vector<int64_t>{k}));
  EXPECT_EQ(loader.epoch(), 1);
#endif
}

TEST(DataLoader, AbandonedPassStateIsWhatTheLoaderDoesNext) {
  Watchdog dog(60);
  for (int64_t workers : {0, 2}) {
    sd::LoaderOptions opts{.batch_size = 2, .shuffle = true, .num_workers = workers, .seed = 1};
    sd::DataLoader<std::vector<st::Tensor>> live(list_rows(8), opts);
    sd::LoaderState inside;
    int k = 0;
    for (auto& b : live) {
      (void)b;
      inside = live.state();  // the pass is live: its rest comes next
      if (++k == 2) break;
    }
    EXPECT_EQ(inside.epoch, 0);
    EXPECT_EQ(inside.batches, 2);
    const sd::LoaderState after = live.state();  // the pass was abandoned
    EXPECT_EQ(after.epoch, 1);
    EXPECT_EQ(after.batches, 0);
    EXPECT_EQ(live.epoch(), 1);
    // Re-iterating the live loader and restoring `after` into a fresh one agree.
    sd::DataLoader<std::vector<st::Tensor>> restored(list_rows(8), opts);
    restored.load_state(after);
    auto next = list_pass(live);
    EXPECT_EQ(next.size(), 4u);
    expect_same_lists(next, list_pass(restored));
    // A state taken inside the loop resumes the rest of epoch 0.
    sd::DataLoader<std::vector<st::Tensor>> reference(list_rows(8), opts), resumed(list_rows(8), opts);
    resumed.load_state(inside);
    auto epoch0 = list_pass(reference);
    expect_same_lists(list_pass(resumed), {epoch0.begin() + 2, epoch0.end()});
  }
  // The same after a batch fails.
  for (int64_t workers : {0, 2}) {
    sd::LoaderOptions opts{.batch_size = 3, .shuffle = true, .num_workers = workers, .seed = 4};
    sd::DataLoader<sd::Example> live(std::make_shared<FailsOnce>(rows(12), 5), opts);
    EXPECT_THROW(pass(live), st::Error);
    const sd::LoaderState after = live.state();
    EXPECT_EQ(after.epoch, 1);
    EXPECT_EQ(after.batches, 0);
    sd::DataLoader<sd::Example> restored(rows(12), opts);
    restored.load_state(after);
    auto next = pass(live);
    EXPECT_EQ(next.size(), 4u);
    expect_same_batches(next, pass(restored));
    EXPECT_EQ(live.state(), restored.state());
  }
}

// As in PyTorch: without a seed, manual_seed decides the shuffled order; the drawn seed is
// in the loader's state, so a run resumed under another global seed keeps its order.
TEST(DataLoader, ShuffleSeedComesFromTheDefaultGenerator) {
  auto order = [](std::optional<uint64_t> seed) {
    sd::DataLoader<sd::Example> loader(rows(32), {.batch_size = 32, .shuffle = true, .seed = seed});
    return targets_of(pass(loader)[0]);
  };
  st::manual_seed(1);
  const std::vector<int64_t> first = order(std::nullopt);
  st::manual_seed(12345);
  const std::vector<int64_t> second = order(std::nullopt);
  st::manual_seed(1);
  EXPECT_EQ(order(std::nullopt), first);
  EXPECT_NE(first, second);
  // an explicit seed does not depend on the global one, and draws nothing from it
  const std::vector<int64_t> seeded = order(7);
  st::manual_seed(99);
  const uint64_t offset = st::default_generator().offset();
  EXPECT_EQ(order(7), seeded);
  EXPECT_EQ(st::default_generator().offset(), offset);
  // nor does a loader that does not shuffle
  sd::DataLoader<sd::Example> in_order(rows(4), {.batch_size = 4});
  EXPECT_EQ(st::default_generator().offset(), offset);
  EXPECT_EQ(in_order.state().seed, 0u);

  st::manual_seed(1);
  sd::DataLoader<sd::Example> loader(rows(32), {.batch_size = 8, .shuffle = true});
  std::vector<int64_t> seen;
  sd::LoaderState half;
  for (auto& b : loader) {
    for (int64_t t : targets_of(b)) seen.push_back(t);
    if (seen.size() == 16) {
      half = loader.state();
      break;
    }
  }
  st::manual_seed(2);
  sd::DataLoader<sd::Example> resumed(rows(32), {.batch_size = 8, .shuffle = true});
  resumed.load_state(half);
  for (auto& b : resumed)
    for (int64_t t : targets_of(b)) seen.push_back(t);
  EXPECT_EQ(seen, first);
}

TEST(DataLoader, StateRecordsWhatFixesTheBatches) {
  sd::LoaderOptions opts{.batch_size = 3, .shuffle = true, .seed = 8};
  sd::DataLoader<sd::Example> loader(rows(10), opts);
  sd::LoaderState s;
  for (auto& b : loader) {
    (void)b;
    s = loader.state();
    break;
  }
  EXPECT_EQ(s.batches, 1);
  EXPECT_EQ(s.dataset_size, 10);
  EXPECT_EQ(s.samples, 10);
  EXPECT_EQ(s.batch_size, 3);
  EXPECT_EQ(s.shuffle, true);
  EXPECT_EQ(s.drop_last, false);
  EXPECT_EQ(sd::LoaderState::from_map(s.to_map()), s);

  // The dataset grew (with the same number of batches per epoch): another permutation.
  sd::DataLoader<sd::Example> grown(rows(11), opts);
  EXPECT_TRUE(st::testing::throws_with([&] { grown.load_state(s); }, {"dataset size = 10 but this loader has 11"}));
  sd::LoaderOptions other = opts;
  other.batch_size = 4;
  EXPECT_TRUE(st::testing::throws_with([&] { sd::DataLoader<sd::Example>(rows(10), other).load_state(s); },
                                       {"batch_size = 3 but this loader has 4"}));
  other = opts;
  other.drop_last = true;
  EXPECT_TRUE(st::testing::throws_with([&] { sd::DataLoader<sd::Example>(rows(10), other).load_state(s); },
                                       {"drop_last = false"}));
  other = opts;
  other.shuffle = false;
  EXPECT_TRUE(st::testing::throws_with([&] { sd::DataLoader<sd::Example>(rows(10), other).load_state(s); },
                                       {"shuffle = true"}));
  // A DistributedSampler share for another world size: the same dataset, another sampler size.
  auto share = [](int64_t world) {
    return sd::LoaderOptions{.batch_size = 1, .sampler = std::make_shared<sd::DistributedSampler>(12, 0, world)};
  };
  sd::DataLoader<sd::Example> two(rows(12), share(2)), three(rows(12), share(3));
  EXPECT_TRUE(st::testing::throws_with([&] { three.load_state(two.state()); },
                                       {"samples per epoch (the sampler's size) = 6 but this loader has 4"}));
  // A refused state changes nothing.
  EXPECT_EQ(grown.state().epoch, 0);
  EXPECT_EQ(grown.state().seed, 8u);

  // A state from an older checkpoint (epoch, batches and seed only) is not checked.
  auto old_map = s.to_map();
  for (const char* key : {"dataset_size", "samples", "batch_size", "shuffle", "drop_last"}) old_map.erase(key);
  sd::LoaderState old = sd::LoaderState::from_map(old_map);
  EXPECT_FALSE(old.dataset_size.has_value());
  grown.load_state(old);
  EXPECT_EQ(grown.state().epoch, 0);
  EXPECT_EQ(grown.state().batches, 1);
}

TEST(DataLoaderBadInput, EpochsThatCannotAdvance) {
  sd::DataLoader<sd::Example> loader(rows(5), {.batch_size = 2, .shuffle = true});
  EXPECT_TRUE(st::testing::throws_with([&] { loader.set_epoch(INT64_MAX); }, {"past the last one a loader can run"}));
  sd::LoaderState s;
  s.epoch = INT64_MAX;
  EXPECT_TRUE(st::testing::throws_with([&] { loader.load_state(s); }, {"past the last one a loader can run"}));
  EXPECT_EQ(loader.epoch(), 0) << "a refused epoch changes nothing";
  // The last epoch runs; after it, none can start.
  loader.set_epoch(INT64_MAX - 1);
  EXPECT_EQ(pass(loader).size(), 3u);
  EXPECT_EQ(loader.epoch(), INT64_MAX);
  EXPECT_EQ(loader.state().epoch, INT64_MAX);
  EXPECT_TRUE(
      st::testing::throws_with([&] { (void)loader.begin(); }, {"epoch 9223372036854775807 is past the last one"}));
  // Abandoned at the last epoch: the same.
  loader.set_epoch(INT64_MAX - 1);
  for (auto& b : loader) {
    (void)b;
    break;
  }
  EXPECT_EQ(loader.state().epoch, INT64_MAX);
  EXPECT_TRUE(st::testing::throws_with([&] { (void)loader.begin(); }, {"past the last one"}));
  EXPECT_EQ(loader.epoch(), INT64_MAX);
  loader.set_epoch(0);  // and the loader is still usable
  EXPECT_EQ(pass(loader).size(), 3u);
}

TEST(DataLoaderBadInput, MovedFromLoader) {
  sd::DataLoader<sd::Example> a(rows(4), {.batch_size = 2, .num_workers = 1});
  sd::DataLoader<sd::Example> b(std::move(a));
  const char* moved = "this DataLoader was moved from";
  // NOLINTNEXTLINE(bugprone-use-after-move): the point of the test
  EXPECT_TRUE(st::testing::throws_with([&] { (void)a.size(); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { (void)a.state(); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { (void)a.begin(); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { (void)a.epoch(); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { (void)a.options(); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { a.set_epoch(1); }, {moved}));
  EXPECT_TRUE(st::testing::throws_with([&] { a.load_state(sd::LoaderState{}); }, {moved}));
  EXPECT_EQ(pass(b).size(), 2u);
}

TEST(DataLoaderBadInput, ThrowingAnythingIsWrapped) {
  Watchdog dog(60);
  for (int64_t workers : {0, 2}) {
    sd::LoaderOptions opts{.batch_size = 2, .num_workers = workers};
    sd::DataLoader<sd::Example> loader(rows(4), opts, [](std::vector<sd::Example>&&) -> sd::Example { throw 42; });
    EXPECT_TRUE(st::testing::throws_with(
        [&] { pass(loader); }, {"collating batch 0 failed: an exception that is not a std::exception"}))
        << "workers " << workers;
    sd::DataLoader<sd::Example> loader2(rows(4), opts, [](std::vector<sd::Example>&& s) -> sd::Example {
      if (s.size() == 2) throw std::runtime_error("odd batch");
      return {};
    });
    EXPECT_TRUE(st::testing::throws_with([&] { pass(loader2); }, {"collating batch 0 failed: odd batch"}));
  }
  // The sample path, for comparison.
  class Throws : public sd::Dataset<sd::Example> {
   public:
    int64_t size() const override { return 3; }
    sd::Example get(int64_t) const override { throw "a string"; }
  };
  sd::DataLoader<sd::Example> loader(std::make_shared<Throws>(), {.num_workers = 1});
  EXPECT_TRUE(st::testing::throws_with(
      [&] { pass(loader); }, {"loading sample 0 (batch 0) failed: an exception that is not a std::exception"}));
}
