// The interleaved 1F1B schedule: Megatron-LM's forward_backward_pipelining_with_interleaving.
// Rank k holds v model chunks; its chunk c is the model's stage c * p + k (p ranks), so a
// micro-batch leaves the last rank for rank 0's next chunk. Micro-batches go through the chunks
// in groups of p: the forward order is, for each group of p micro-batches, chunk 0 on all of
// them, then chunk 1, ...; the backward order the same with the chunks reversed. Every rank
// uses these two orders, so what rank k sends to k + 1 (and back) arrives in the order k + 1
// asks for it.
#include <strata/dist/pipeline.hpp>

#include <algorithm>
#include <utility>

#include <strata/ops/creation.hpp>

namespace strata::dist {

namespace {

// Tags apart: with two ranks, rank 0 sends rank 1 both activations (its chunk c to rank 1's c)
// and gradients (its chunk c + 1 to rank 1's c), which are received in different orders.
constexpr int kGradientTag = 1;

}  // namespace

ScheduleInterleaved1F1B::ScheduleInterleaved1F1B(std::vector<nn::Module*> stages, PipelineOptions options)
    : PipelineSchedule(std::move(stages), std::move(options), "ScheduleInterleaved1F1B", kGradientTag) {
  const int64_t p = group_->size();
  STRATA_CHECK(group_->backend() == "mpi",
               "[{}] needs sends that do not wait for their receive (the mpi backend); the {} backend's "
               "would need grouped send/recv, not done",
               name_, group_->backend());
  STRATA_CHECK(p >= 2, "[{}] needs at least 2 ranks: on one, run the stages in a row", name_);
  STRATA_CHECK(chunks_ % p == 0,
               "[{}] {} micro-batches do not go through the stages in groups of one per rank: chunks must be a "
               "multiple of the {} ranks",
               name_, chunks_, p);
  // a rank with another layout would wait forever on messages that never come: every rank
  // compares every rank's (stages, chunks) and raises alike (the constructor is collective)
  std::vector<Tensor> layouts;
  for (int64_t r = 0; r < p; ++r) layouts.push_back(empty({2}, TensorOptions(kInt64)));
  group_->allgather(layouts, from_vector(std::vector<int64_t>{stages_per_rank(), chunks_}))->wait();
  const int64_t* first = layouts.front().data_ptr<int64_t>();
  for (int64_t r = 1; r < p; ++r) {
    const int64_t* theirs = layouts[static_cast<size_t>(r)].data_ptr<int64_t>();
    STRATA_CHECK(theirs[0] == first[0] && theirs[1] == first[1],
                 "[{}] rank {} has {} stages and {} micro-batches, rank 0 {} and {}: every rank needs the same", name_,
                 r, theirs[0], theirs[1], first[0], first[1]);
  }
}

std::vector<PipelineSchedule::Action> ScheduleInterleaved1F1B::actions() const {
  const int64_t p = group_->size(), v = stages_per_rank(), rank = group_->rank();
  const int64_t total = chunks_ * v;  // forwards (and backwards) of this rank
  // the k-th forward (backward) of every rank: micro-batch group k / (p * v), chunk (k / p) % v
  // (reversed for backwards), micro-batch p * group + k % p
  auto at = [&](int64_t k, bool forward) {
    const int64_t group = k / (p * v), chunk = (k % (p * v)) / p;
    return Action{forward, group * p + k % p, false, forward ? chunk : v - 1 - chunk};
  };
  // Megatron's warm-up: enough forwards that the first backward's gradient, which comes back
  // through the later ranks and the remaining chunks, arrives as the next forward is done
  const int64_t warmup = std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
  std::vector<Action> order;
  int64_t next_forward = 0, next_backward = 0;
  while (next_forward < warmup) order.push_back(at(next_forward++, true));
  while (next_forward < total) {
    order.push_back(at(next_forward++, true));
    order.push_back(at(next_backward++, false));
  }
  while (next_backward < total) order.push_back(at(next_backward++, false));
  return order;
}

}  // namespace strata::dist
