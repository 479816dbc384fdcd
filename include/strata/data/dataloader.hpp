// DataLoader: batches from a dataset, in sampler order, built by worker threads ahead of the
// training loop. One pass of a range-for is one epoch:
//
//   data::DataLoader<data::Example> loader(dataset, {.batch_size = 64, .shuffle = true, .num_workers = 4});
//   for (auto& batch : loader) { ... batch.input ... batch.target ... }
//
// The batch type is the only template parameter, so a loader can be a class member whatever
// the dataset's sample type; the dataset and collate function are erased behind the
// constructor. Batches arrive in the same order for every worker count (Note [Reorder
// buffer] in src/data/dataloader.cpp), so a run is reproducible from its seed, and
// state() / load_state() resume a pass mid-epoch.
//
// Note [Abandoned pass]: a pass is live while one of its iterators exists. Leaving it early
// (a break, or a batch that raised) abandons it, and the next pass starts the next epoch, as a
// new Python iterator does. state() always says where this loader's next batch comes from:
// inside the loop, the rest of the live pass; after an abandoned pass, the start of the next
// epoch. So to resume mid-epoch from a checkpoint, take state() inside the loop, before a break.
// An abandoned pass's workers stop, and the batches they prepared ahead are freed, as soon as
// its last iterator is destroyed (the end of the loop's scope). One pass is live at a time: an
// iterator of a pass that a later begin() abandoned raises when advanced. A loader is driven by
// one thread at a time; two threads in its passes at once raise.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>
#include <strata/data/dataset.hpp>
#include <strata/data/loader_state.hpp>
#include <strata/data/sampler.hpp>

namespace strata::data {

/// How a DataLoader batches, orders and prefetches.
struct LoaderOptions {
  int64_t batch_size = 1;
  /// A new permutation each epoch from (seed, epoch); otherwise dataset order.
  bool shuffle = false;
  /// Drop the last batch when it would be smaller than batch_size.
  bool drop_last = false;
  /// Threads that fetch and collate whole batches; 0 builds batches in the calling thread.
  int64_t num_workers = 0;
  /// Batches each worker may build ahead of the training loop (the queue holds at most
  /// prefetch * num_workers batches; a product past INT64_MAX means no bound).
  int64_t prefetch = 2;
  /// Return batches whose tensors are in page-locked memory (Tensor::pin_memory).
  bool pin_memory = false;
  /// The shuffling seed. Unset, a shuffling loader draws it from the default generator when it
  /// is made, so manual_seed decides the order, as in PyTorch; the loader's state records it.
  std::optional<uint64_t> seed;
  /// A custom order (for example a DistributedSampler); replaces shuffle's default sampler.
  std::shared_ptr<const Sampler> sampler;
};

/// Default collation: stacks samples along a new dim 0 (strata::stack).
STRATA_API Tensor default_collate(std::vector<Tensor>&& samples);
/// Stacks the inputs and the targets.
STRATA_API Example default_collate(std::vector<Example>&& samples);
/// Stacks position k of every sample into tensor k of the batch.
STRATA_API std::vector<Tensor> default_collate(std::vector<std::vector<Tensor>>&& samples);

/// Pinned copies of a batch's tensors. Overload pin_memory for your own batch type (in its
/// namespace) to use LoaderOptions::pin_memory with it.
STRATA_API Tensor pin_memory(const Tensor& batch);
STRATA_API Example pin_memory(const Example& batch);
STRATA_API std::vector<Tensor> pin_memory(const std::vector<Tensor>& batch);

namespace detail {

/// A type-erased batch, and the function that builds batch `batch` from sample indices.
using BatchPtr = std::shared_ptr<void>;
using FetchFn = std::function<BatchPtr(const std::vector<int64_t>& indices, int64_t batch)>;
/// Tells the dataset the epoch of the pass that is starting (Dataset::set_epoch).
using EpochFn = std::function<void(int64_t epoch)>;

[[noreturn]] STRATA_API void throw_sample_error(int64_t index, int64_t batch, const char* what);
[[noreturn]] STRATA_API void throw_collate_error(int64_t batch, const char* what);

/// Everything of a DataLoader that does not depend on the batch type: the sampler, the
/// epoch cursor and the worker threads.
class STRATA_API LoaderCore {
 public:
  LoaderCore(int64_t dataset_size, LoaderOptions options, FetchFn fetch, EpochFn on_epoch = {});
  ~LoaderCore();
  LoaderCore(const LoaderCore&) = delete;
  LoaderCore& operator=(const LoaderCore&) = delete;

  /// Starts a pass: resumes a restored position, or else begins the next epoch, and tells the
  /// dataset that epoch (Dataset::set_epoch). The pass is live while the returned token is
  /// held (by its iterators; Note [Abandoned pass]). If it raises, no pass started and the
  /// next call retries the same position.
  std::shared_ptr<void> start_pass();
  /// The next batch of the pass `pass` (its token), or null once the pass is over. Raises
  /// strata::Error when `pass` is no longer the live pass.
  BatchPtr next(const std::shared_ptr<void>& pass);
  int64_t num_batches() const { return num_batches_; }
  /// The epoch of the live pass, or the one the next pass starts.
  int64_t epoch() const;
  void set_epoch(int64_t epoch);
  LoaderState state() const;
  void load_state(const LoaderState& state);
  const LoaderOptions& options() const { return options_; }

 private:
  struct Pipeline;
  std::vector<int64_t> batch_indices(int64_t batch) const;
  bool abandoned() const;  // a pass was left early; the next one starts epoch_ + 1
  void start_workers();
  void work(Pipeline& p);  // one worker thread's loop
  void stop_workers();
  void make_default_sampler();

  int64_t dataset_size_;
  LoaderOptions options_;
  FetchFn fetch_;
  EpochFn on_epoch_;
  std::shared_ptr<const Sampler> sampler_;
  int64_t num_batches_ = 0;
  int64_t epoch_ = 0;
  int64_t delivered_ = 0;       // batches of epoch_ handed out
  bool resume_pending_ = true;  // the next pass starts at (epoch_, delivered_)
  bool in_pass_ = false;
  std::weak_ptr<void> pass_;    // the live pass's token, expired once its iterators are gone
  std::vector<int64_t> order_;  // the sampler's indices for epoch_
  std::shared_ptr<Pipeline> pipeline_;  // shared with the pass token, which stops it
  std::atomic<bool> busy_{false};       // a thread is in start_pass or next
};

}  // namespace detail

/// Batches of type Batch from a dataset; see the top of this file.
template <class Batch>
class DataLoader {
 public:
  template <class Sample>
  using CollateFn = std::function<Batch(std::vector<Sample>&&)>;

  /// `collate` turns the samples of one batch into a Batch; when empty, default_collate is
  /// used (Tensor, Example and std::vector<Tensor> samples).
  template <class D>
  DataLoader(std::shared_ptr<D> dataset, LoaderOptions options = {},
             CollateFn<typename D::sample_type> collate = {}) {
    using Sample = typename D::sample_type;
    static_assert(std::is_base_of_v<Dataset<Sample>, D>, "DataLoader needs a strata::data::Dataset");
    STRATA_CHECK(dataset != nullptr, "[DataLoader] null dataset");
    if (!collate) {
      if constexpr (requires(std::vector<Sample>&& s) {
                      { default_collate(std::move(s)) } -> std::convertible_to<Batch>;
                    }) {
        collate = [](std::vector<Sample>&& s) -> Batch { return default_collate(std::move(s)); };
      } else {
        STRATA_CHECK(false,
                     "[DataLoader] no default collation for this sample and batch type: pass a collate function");
      }
    }
    bool pin = options.pin_memory;
    if constexpr (!requires(const Batch& b) { { pin_memory(b) } -> std::convertible_to<Batch>; }) {
      STRATA_CHECK(!pin, "[DataLoader] pin_memory is set but no pin_memory(const Batch&) overload exists for "
                         "this batch type");
    }
    detail::EpochFn on_epoch;
    if constexpr (!std::is_const_v<D>) {
      // through the base: a set_epoch of D's own that is no override (other parameters) is not called
      on_epoch = [d = dataset](int64_t epoch) { static_cast<Dataset<Sample>&>(*d).set_epoch(epoch); };
    }
    std::shared_ptr<const Dataset<Sample>> data = std::move(dataset);
    int64_t size = data->size();
    detail::FetchFn fetch = [data, collate = std::move(collate), pin](const std::vector<int64_t>& indices,
                                                                       int64_t b) -> detail::BatchPtr {
      std::vector<Sample> samples;
      samples.reserve(indices.size());
      for (int64_t i : indices) {
        try {
          samples.push_back(data->get(i));
        } catch (const std::exception& e) {
          detail::throw_sample_error(i, b, e.what());
        } catch (...) {
          detail::throw_sample_error(i, b, "an exception that is not a std::exception");
        }
      }
      std::shared_ptr<Batch> out;
      try {
        out = std::make_shared<Batch>(collate(std::move(samples)));
        if constexpr (requires(const Batch& x) { { pin_memory(x) } -> std::convertible_to<Batch>; }) {
          if (pin) *out = pin_memory(*out);
        }
      } catch (const std::exception& e) {
        detail::throw_collate_error(b, e.what());
      } catch (...) {
        detail::throw_collate_error(b, "an exception that is not a std::exception");
      }
      return out;
    };
    core_ = std::make_unique<detail::LoaderCore>(size, std::move(options), std::move(fetch), std::move(on_epoch));
  }

  class iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    Batch& operator*() const { return *static_cast<Batch*>(batch_.get()); }
    Batch* operator->() const { return static_cast<Batch*>(batch_.get()); }
    iterator& operator++() {
      batch_ = core_->next(pass_);
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return batch_ == nullptr; }

   private:
    friend class DataLoader;
    iterator(detail::LoaderCore* core, detail::BatchPtr batch, std::shared_ptr<void> pass)
        : core_(core), batch_(std::move(batch)), pass_(std::move(pass)) {}
    detail::LoaderCore* core_ = nullptr;
    detail::BatchPtr batch_;
    std::shared_ptr<void> pass_;  // keeps the pass live (Note [Abandoned pass])
  };

  /// Starts a pass (one epoch, or the rest of a restored one). Starting a new pass before the
  /// previous one ended abandons it; its next epoch begins (Note [Abandoned pass]).
  iterator begin() {
    std::shared_ptr<void> pass = core().start_pass();
    detail::BatchPtr first = core_->next(pass);
    return iterator(core_.get(), std::move(first), std::move(pass));
  }
  std::default_sentinel_t end() const { return {}; }

  /// Batches per epoch.
  int64_t size() const { return core().num_batches(); }
  /// The epoch in progress, or the one the next pass starts.
  int64_t epoch() const { return core().epoch(); }
  /// Makes the next pass start at the beginning of `epoch` (below INT64_MAX).
  void set_epoch(int64_t epoch) { core().set_epoch(epoch); }
  /// The position to store in a checkpoint: where this loader's next batch comes from (the
  /// rest of the live pass, or after an abandoned one the next epoch; Note [Abandoned pass]).
  LoaderState state() const { return core().state(); }
  /// Restores a position: the next pass produces the batches that followed it. Raises
  /// strata::Error if the state was taken from a loader that batches differently (another
  /// dataset size, sampler size, batch_size, shuffle or drop_last).
  void load_state(const LoaderState& state) { core().load_state(state); }
  const LoaderOptions& options() const { return core().options(); }

 private:
  detail::LoaderCore& core() const {
    STRATA_CHECK(core_ != nullptr, "[DataLoader] this DataLoader was moved from; use the one it was moved to");
    return *core_;
  }

  std::unique_ptr<detail::LoaderCore> core_;
};

}  // namespace strata::data
