// The data-parallel wrappers' shared steps (model_sync.h).
#include "dist/model_sync.h"

#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist::detail {

void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors) {
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& t : tensors)
    if (t.defined()) works.push_back(group.broadcast(t.detach(), 0));
  for (auto& w : works) w->wait();
}

// Every rank must wrap the same model: compares the count and shapes of the parameters and
// buffers (all of them: frozen ones are broadcast too, and a broadcast of mismatched sizes fails
// or hangs) across ranks (their sizes, weighted by position, summed) and raises on every rank
// together when they differ.
void check_same_model(ProcessGroup& group, const std::vector<Tensor>& params, const char* who) {
  check_same_model(std::vector<ProcessGroup*>{&group}, params, who);
}

void check_same_model(const std::vector<ProcessGroup*>& groups, const std::vector<Tensor>& params, const char* who) {
  int64_t count = static_cast<int64_t>(params.size()), total = 0, weighted = 0, dims = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    total += params[k].numel();
    weighted += static_cast<int64_t>(k + 1) * params[k].numel();
    for (int64_t d = 0; d < params[k].dim(); ++d) dims += (d + 1) * params[k].size(d);
  }
  const std::vector<int64_t> mine{count, total, weighted, dims};
  Tensor hi = from_vector(mine), lo = from_vector(mine);
  if (!params.empty() && params.front().is_cuda()) {
    hi = hi.to(params.front().device());
    lo = lo.to(params.front().device());
  }
  for (ProcessGroup* group : groups) {
    auto w1 = group->allreduce(hi, ReduceOp::Max);
    auto w2 = group->allreduce(lo, ReduceOp::Min);
    w1->wait();
    w2->wait();
  }
  STRATA_CHECK(equal(hi, lo),
               "[{}] the ranks wrap different models: this rank has {} parameters and buffers of {} elements in all; "
               "every rank must construct the same model",
               who, count, total);
}

void agree_on_error(ProcessGroup& group, std::exception_ptr error, Device device, const char* who, const char* what) {
  Tensor first = full({1}, error ? group.rank() : group.size(), TensorOptions(kInt32, device));
  group.allreduce(first, ReduceOp::Min)->wait();
  const int failed = first.cpu().item<int32_t>();
  if (error) std::rethrow_exception(error);
  STRATA_CHECK(failed == group.size(), "[{}] {} failed on rank {} (its error names the cause)", who, what, failed);
}

}  // namespace strata::dist::detail
