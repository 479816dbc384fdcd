// The interleaved 1F1B schedule: Megatron-LM's forward_backward_pipelining_with_interleaving.
// Rank k holds v model chunks; its chunk c is the model's stage c * p + k (p ranks), so a
// micro-batch leaves the last rank for rank 0's next chunk. Micro-batches go through the chunks
// in groups of p: the forward order is, for each group of p micro-batches, chunk 0 on all of
// them, then chunk 1, ...; the backward order the same with the chunks reversed. Every rank
// uses these two orders, so what rank k sends to k + 1 (and back) arrives in the order k + 1
// asks for it.
#include <strata/dist/pipeline.hpp>

#include <algorithm>
#include <exception>
#include <utility>

#include <strata/ops/creation.hpp>

#include "dist/working_copy.h"

namespace strata::dist {

namespace {

// Tags apart: with two ranks, rank 0 sends rank 1 both activations (its chunk c to rank 1's c)
// and gradients (its chunk c + 1 to rank 1's c), which are received in different orders.
constexpr int kGradientTag = 1;

}  // namespace

// The constructor is collective: a rank whose arguments differ from the others' (or that it
// cannot take) would leave them waiting, in this comparison or in the first step's receives, so
// every rank's (stages, chunks, whether its own checks failed) is gathered before the base
// class sees the arguments, and every rank raises alike: its own error, or one naming the rank.
std::vector<nn::Module*> ScheduleInterleaved1F1B::agreed_stages(std::vector<nn::Module*> stages,
                                                                const PipelineOptions& options) {
  const char* name = "ScheduleInterleaved1F1B";
  auto group = detail::group_or_default(options.process_group);
  const int64_t p = group->size(), chunks = options.chunks;
  STRATA_CHECK(group->backend() == "mpi",
               "[{}] needs sends that do not wait for their receive (the mpi backend); the {} backend's "
               "would need grouped send/recv, not done",
               name, group->backend());
  STRATA_CHECK(p >= 2, "[{}] needs at least 2 ranks: on one, run the stages in a row", name);
  std::exception_ptr error;
  try {
    check_arguments(name, stages, chunks);
    STRATA_CHECK(chunks % p == 0,
                 "[{}] {} micro-batches do not go through the stages in groups of one per rank: chunks must be a "
                 "multiple of the {} ranks",
                 name, chunks, p);
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<Tensor> layouts;
  for (int64_t r = 0; r < p; ++r) layouts.push_back(empty({3}, TensorOptions(kInt64)));
  const std::vector<int64_t> mine{static_cast<int64_t>(stages.size()), chunks, error ? 1 : 0};
  group->allgather(layouts, from_vector(mine))->wait();
  if (error) std::rethrow_exception(error);
  const int64_t* first = layouts.front().data_ptr<int64_t>();
  for (int64_t r = 0; r < p; ++r) {
    const int64_t* theirs = layouts[static_cast<size_t>(r)].data_ptr<int64_t>();
    STRATA_CHECK(theirs[2] == 0, "[{}] rank {} raised on its arguments (its error names them)", name, r);
    STRATA_CHECK(theirs[0] == first[0] && theirs[1] == first[1],
                 "[{}] rank {} has {} stages and {} micro-batches, rank 0 {} and {}: every rank needs the same", name,
                 r, theirs[0], theirs[1], first[0], first[1]);
  }
  return stages;
}

ScheduleInterleaved1F1B::ScheduleInterleaved1F1B(std::vector<nn::Module*> stages, PipelineOptions options)
    : PipelineSchedule(agreed_stages(std::move(stages), options), options, "ScheduleInterleaved1F1B", kGradientTag) {}

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
