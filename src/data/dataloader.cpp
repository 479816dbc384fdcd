// The batch-type-independent half of DataLoader: the epoch cursor, the sampler, and the
// worker threads with their reorder buffer.
//
// Note [Reorder buffer]: workers take batch numbers in order from a shared counter, but
// finish them in any order. Finished batches wait in a map keyed by batch number, and the
// training loop takes batch k only when it is there, so batches arrive in sampler order
// whatever the number of workers or their timing. A worker takes batch k only while
// k - next_to_deliver < window, which bounds the memory held ahead of the loop. Every batch
// taken produces an entry (a batch or the exception it raised), so the loop never waits for
// a batch that will not come.
#include <strata/data/dataloader.hpp>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include <strata/core/generator.hpp>
#include <strata/ops/join.hpp>

#include "kernels/common/philox.h"

namespace strata::data {

Tensor default_collate(std::vector<Tensor>&& samples) { return stack(samples, 0); }

Example default_collate(std::vector<Example>&& samples) {
  std::vector<Tensor> inputs, targets;
  inputs.reserve(samples.size());
  targets.reserve(samples.size());
  for (Example& s : samples) {
    inputs.push_back(std::move(s.input));
    targets.push_back(std::move(s.target));
  }
  return Example{stack(inputs, 0), stack(targets, 0)};
}

std::vector<Tensor> default_collate(std::vector<std::vector<Tensor>>&& samples) {
  STRATA_CHECK(!samples.empty(), "[default_collate] empty batch");
  const size_t fields = samples.front().size();
  for (size_t s = 1; s < samples.size(); ++s)  // every sample, even when sample 0 has none
    STRATA_CHECK(samples[s].size() == fields, "[default_collate] sample {} has {} tensors, sample 0 has {}", s,
                 samples[s].size(), fields);
  std::vector<Tensor> out;
  for (size_t k = 0; k < fields; ++k) {
    std::vector<Tensor> column;
    column.reserve(samples.size());
    for (std::vector<Tensor>& sample : samples) column.push_back(std::move(sample[k]));
    out.push_back(stack(column, 0));
  }
  return out;
}

Tensor pin_memory(const Tensor& batch) { return batch.pin_memory(); }
Example pin_memory(const Example& batch) { return Example{batch.input.pin_memory(), batch.target.pin_memory()}; }
std::vector<Tensor> pin_memory(const std::vector<Tensor>& batch) {
  std::vector<Tensor> out;
  out.reserve(batch.size());
  for (const Tensor& t : batch) out.push_back(t.pin_memory());
  return out;
}

namespace detail {

namespace {

// Marks a thread inside a loader's pass; a second thread entering at the same time raises
// (the loader's passes are not thread-safe, and two threads in them could wait forever).
class OneThread {
 public:
  explicit OneThread(std::atomic<bool>& busy) : busy_(busy) {
    STRATA_CHECK(!busy_.exchange(true), "[DataLoader] used from two threads at once: one thread drives a loader "
                                        "(give each thread a loader of its own)");
  }
  ~OneThread() { busy_.store(false); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace

void throw_sample_error(int64_t index, int64_t batch, const char* what) {
  throw Error(fmt::format("[DataLoader] loading sample {} (batch {}) failed: {}", index, batch, what));
}

void throw_collate_error(int64_t batch, const char* what) {
  throw Error(fmt::format("[DataLoader] collating batch {} failed: {}", batch, what));
}

// The worker threads of one pass and the batches they have finished.
struct LoaderCore::Pipeline {
  struct Result {
    BatchPtr batch;
    std::exception_ptr error;
  };
  std::mutex mutex;
  std::condition_variable work_cv;   // workers wait for room in the window
  std::condition_variable ready_cv;  // the loop waits for its next batch
  bool stop = false;
  int64_t next_job = 0, end_job = 0, next_deliver = 0, window = 1;
  std::map<int64_t, Result> ready;
  std::vector<std::thread> threads;

  std::mutex join_mutex;  // held through a halt, so a concurrent one waits for the join

  // Stops and joins the workers and frees the batches they made ahead. The first call takes
  // the threads; a later one finds none left to join, and a concurrent one (an iterator
  // released on another thread while the loader starts a new pass or is destroyed) returns
  // only once the first has joined them: the workers still read the loader until then.
  void halt() {
    std::lock_guard<std::mutex> join_lock(join_mutex);
    std::vector<std::thread> joining;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
      joining.swap(threads);
    }
    work_cv.notify_all();
    ready_cv.notify_all();
    for (std::thread& t : joining) t.join();
    std::map<int64_t, Result> dropped;
    std::lock_guard<std::mutex> lock(mutex);
    dropped.swap(ready);  // freed after the unlock (a batch's destructor is the user's code)
  }
};

LoaderCore::LoaderCore(int64_t dataset_size, LoaderOptions options, FetchFn fetch, EpochFn on_epoch)
    : dataset_size_(dataset_size),
      options_(std::move(options)),
      fetch_(std::move(fetch)),
      on_epoch_(std::move(on_epoch)) {
  STRATA_CHECK(options_.batch_size >= 1, "[DataLoader] batch_size must be at least 1, got {}", options_.batch_size);
  STRATA_CHECK(options_.num_workers >= 0, "[DataLoader] negative num_workers {}", options_.num_workers);
  STRATA_CHECK(options_.prefetch >= 1, "[DataLoader] prefetch must be at least 1, got {}", options_.prefetch);
  STRATA_CHECK(dataset_size >= 0, "[DataLoader] the dataset reports a negative size {}", dataset_size);
  if (!options_.seed) {
    if (options_.shuffle && !options_.sampler) {
      const RandomDraw draw = default_generator().reserve_draw(1);
      options_.seed = philox::bits64_at(draw.seed, draw.offset, 0);
    } else {
      options_.seed = 0;  // nothing to shuffle
    }
  }
  if (options_.sampler) {
    STRATA_CHECK(!options_.shuffle,
                 "[DataLoader] shuffle and a custom sampler exclude each other; let the sampler shuffle");
    sampler_ = options_.sampler;
  } else {
    make_default_sampler();
  }
  int64_t n = sampler_->size(), bs = options_.batch_size;
  num_batches_ = n / bs + (!options_.drop_last && n % bs != 0);  // (n + bs - 1) / bs overflows for a huge bs
}

LoaderCore::~LoaderCore() { stop_workers(); }

void LoaderCore::make_default_sampler() {
  if (options_.shuffle)
    sampler_ = std::make_shared<RandomSampler>(dataset_size_, *options_.seed);
  else
    sampler_ = std::make_shared<SequentialSampler>(dataset_size_);
}

std::vector<int64_t> LoaderCore::batch_indices(int64_t batch) const {
  auto first = static_cast<size_t>(batch * options_.batch_size);
  size_t last = std::min(order_.size(), first + static_cast<size_t>(options_.batch_size));
  return std::vector<int64_t>(order_.begin() + static_cast<std::ptrdiff_t>(first),
                              order_.begin() + static_cast<std::ptrdiff_t>(last));
}

void LoaderCore::stop_workers() {
  if (!pipeline_) return;
  pipeline_->halt();
  pipeline_.reset();
}

// A pass at the last int64 epoch could not advance past it, so none runs there.
static void check_epoch(int64_t epoch) {
  STRATA_CHECK(epoch < INT64_MAX, "[DataLoader] epoch {} is past the last one a loader can run ({})", epoch,
               INT64_MAX - 1);
}

std::shared_ptr<void> LoaderCore::start_pass() {
  const OneThread one(busy_);
  stop_workers();
  in_pass_ = false;
  if (!resume_pending_) {  // the previous pass was abandoned part-way: its epoch is over
    ++epoch_;              // no overflow: that pass ran, so epoch_ < INT64_MAX
    delivered_ = 0;
    resume_pending_ = true;
  }
  // Until the pass is under way, a failure leaves the position for the next call to retry.
  check_epoch(epoch_);
  order_ = sampler_->indices(epoch_);
  STRATA_CHECK(static_cast<int64_t>(order_.size()) == sampler_->size(),
               "[DataLoader] the sampler returned {} indices for epoch {} but its size is {}", order_.size(), epoch_,
               sampler_->size());
  if (on_epoch_) on_epoch_(epoch_);  // no get() of this loader runs: its workers are stopped
  if (options_.num_workers > 0 && delivered_ < num_batches_) start_workers();
  resume_pending_ = false;
  in_pass_ = true;
  // The last iterator of the pass to go stops its workers (Note [Abandoned pass]); a pass
  // already replaced or a loader already gone has nothing left to stop.
  std::weak_ptr<Pipeline> workers = pipeline_;
  std::shared_ptr<void> pass(new int64_t(epoch_), [workers](int64_t* epoch) {
    delete epoch;
    if (std::shared_ptr<Pipeline> p = workers.lock()) p->halt();
  });
  pass_ = pass;
  return pass;
}

void LoaderCore::start_workers() {
  pipeline_ = std::make_shared<Pipeline>();
  Pipeline& p = *pipeline_;
  p.next_job = p.next_deliver = delivered_;
  p.end_job = num_batches_;
  const int64_t workers = options_.num_workers, prefetch = options_.prefetch;
  p.window = prefetch > INT64_MAX / workers ? INT64_MAX : prefetch * workers;  // saturated: no bound
  // More threads than batches left would have nothing to do.
  const int64_t threads = std::min(workers, num_batches_ - delivered_);
  try {
    for (int64_t w = 0; w < threads; ++w) p.threads.emplace_back([this, &p] { work(p); });
  } catch (const std::exception& e) {  // std::system_error when the system refuses another thread
    size_t started = p.threads.size();
    stop_workers();
    strata::detail::throw_error(
        "[DataLoader] could not start worker thread {} of num_workers = {}: {}; lower num_workers", started + 1,
        workers, e.what());
  }
}

void LoaderCore::work(Pipeline& p) {
  std::unique_lock<std::mutex> lock(p.mutex);
  for (;;) {
    // next_job >= next_deliver, so the difference cannot overflow as next_deliver + window could.
    p.work_cv.wait(lock, [&] { return p.stop || p.next_job >= p.end_job || p.next_job - p.next_deliver < p.window; });
    if (p.stop || p.next_job >= p.end_job) return;
    int64_t b = p.next_job++;
    lock.unlock();
    Pipeline::Result r;
    try {
      r.batch = fetch_(batch_indices(b), b);
    } catch (...) {
      r.error = std::current_exception();
    }
    lock.lock();
    p.ready.emplace(b, std::move(r));
    p.ready_cv.notify_all();
  }
}

BatchPtr LoaderCore::next(const std::shared_ptr<void>& pass) {
  const OneThread one(busy_);
  STRATA_CHECK(pass_.lock() == pass,
               "[DataLoader] this iterator's pass was abandoned: a later begin() started another pass (epoch {}), "
               "and one pass is live at a time; take the batches from the new pass's iterator",
               epoch_);
  if (!in_pass_) return nullptr;
  if (delivered_ >= num_batches_) {  // the pass is complete: point at the next epoch
    stop_workers();
    in_pass_ = false;
    ++epoch_;  // no overflow: the pass ran, so epoch_ < INT64_MAX
    delivered_ = 0;
    resume_pending_ = true;
    return nullptr;
  }
  BatchPtr batch;
  try {
    if (!pipeline_) {
      batch = fetch_(batch_indices(delivered_), delivered_);
    } else {
      Pipeline& p = *pipeline_;
      Pipeline::Result r;
      {
        std::unique_lock<std::mutex> lock(p.mutex);
        p.ready_cv.wait(lock, [&] { return p.ready.count(delivered_) != 0 || p.stop; });
        STRATA_CHECK(!p.stop, "[DataLoader] the pass's workers were stopped");  // its iterators are gone
        auto it = p.ready.find(delivered_);
        r = std::move(it->second);
        p.ready.erase(it);
        ++p.next_deliver;
      }
      p.work_cv.notify_all();
      if (r.error) std::rethrow_exception(r.error);
      batch = std::move(r.batch);
    }
  } catch (...) {
    // The pass ends here, abandoned: the next one starts the next epoch (Note [Abandoned pass]).
    stop_workers();
    in_pass_ = false;
    throw;
  }
  ++delivered_;
  return batch;
}

void LoaderCore::set_epoch(int64_t epoch) {
  STRATA_CHECK(epoch >= 0, "[DataLoader] negative epoch {}", epoch);
  LoaderState s;
  s.epoch = epoch;
  s.seed = *options_.seed;
  load_state(s);
}

bool LoaderCore::abandoned() const { return !resume_pending_ && (!in_pass_ || pass_.expired()); }

int64_t LoaderCore::epoch() const { return abandoned() ? epoch_ + 1 : epoch_; }

LoaderState LoaderCore::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.batches = delivered_;
  s.seed = *options_.seed;
  s.dataset_size = dataset_size_;
  s.samples = sampler_->size();
  s.batch_size = options_.batch_size;
  s.shuffle = options_.shuffle;
  s.drop_last = options_.drop_last;
  // A pass left early (its iterators gone, or a batch raised) is over: the next pass starts
  // the next epoch (Note [Abandoned pass] in dataloader.hpp), and so does the state. A fully
  // delivered epoch is the start of the next one too, so that a resumed run does not begin
  // with an empty pass. Either way a pass ran at epoch_, so epoch_ + 1 does not overflow.
  if (abandoned() || (delivered_ >= num_batches_ && num_batches_ > 0)) {
    s.epoch = epoch_ + 1;
    s.batches = 0;
  }
  return s;
}

void LoaderCore::load_state(const LoaderState& state) {
  STRATA_CHECK(state.epoch >= 0 && state.batches >= 0, "[DataLoader] invalid state: epoch {}, batches {}", state.epoch,
               state.batches);
  check_epoch(state.epoch);
  // A state from a loader that batches differently would resume another sequence silently.
  auto same = [](const auto& saved, auto here, const char* what) {
    STRATA_CHECK(!saved || *saved == here,
                 "[DataLoader] the state was taken with {} = {} but this loader has {}: its batches would differ", what,
                 *saved, here);
  };
  same(state.dataset_size, dataset_size_, "dataset size");
  same(state.samples, sampler_->size(), "samples per epoch (the sampler's size)");
  same(state.batch_size, options_.batch_size, "batch_size");
  same(state.shuffle, options_.shuffle, "shuffle");
  same(state.drop_last, options_.drop_last, "drop_last");
  STRATA_CHECK(state.batches <= num_batches_,
               "[DataLoader] the state has {} batches delivered but an epoch has only {}", state.batches, num_batches_);
  if (state.seed != options_.seed) {
    STRATA_CHECK(!options_.sampler,
                 "[DataLoader] the state's seed {} differs from the seed {} of this loader's custom sampler",
                 state.seed, *options_.seed);
    options_.seed = state.seed;
    make_default_sampler();
  }
  stop_workers();
  in_pass_ = false;
  epoch_ = state.epoch;
  delivered_ = state.batches;
  if (delivered_ == num_batches_ && num_batches_ > 0) {
    ++epoch_;  // no overflow: check_epoch above
    delivered_ = 0;
  }
  resume_pending_ = true;
}

}  // namespace detail
}  // namespace strata::data
