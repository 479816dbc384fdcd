// DDP's gradient reducer.
//
// Note [DDP buckets]: the parameters are walked in reverse (the last layer's gradients are
// ready first in a backward pass) and packed into buckets of one dtype and device, each at most
// bucket_cap bytes, each with one flat buffer. When a parameter's gradient has been accumulated
// into .grad, its hook copies it into the bucket; when a bucket has all its gradients, it starts
// an asynchronous allreduce (Avg) and the backward goes on computing meanwhile. Buckets start in
// index order (a ready bucket waits for the ones before it), so every rank issues the same
// collectives in the same order whatever order its hooks fire in. At the end of the backward (a
// callback queued on the engine) the gradients that never arrived (parameters unused in this
// step) count with their current .grad, or zeros, the remaining buckets start, all are waited
// for, and the averages are written into .grad. A communication hook (register_comm_hook)
// replaces a bucket's allreduce: it is called where the allreduce would start and returns a
// future of the reduced buffer, waited for in bucket order at the end. Buckets are not rebuilt
// from the observed gradient order after the first step, as PyTorch does.
#include "dist/reducer.h"

#include <algorithm>
#include <unordered_set>

#include <strata/autograd/autograd.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist::detail {

Reducer::Reducer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> group, int64_t bucket_cap_bytes,
                 bool find_unused_parameters)
    : params_(std::move(params)), group_(std::move(group)), find_unused_(find_unused_parameters) {
  slots_.resize(params_.size());
  std::vector<int64_t> sizes;  // elements per bucket
  // the open bucket of each (dtype, device), by bucket index
  std::vector<std::pair<std::pair<DType, Device>, size_t>> open;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const auto key = std::make_pair(p.dtype(), p.device());
    size_t b = bucket_params_.size();
    for (auto& [okey, index] : open)
      if (okey == key) b = index;
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.itemsize());
    const bool fits = b < bucket_params_.size() &&
                      (sizes[b] * static_cast<int64_t>(p.itemsize()) + bytes <= bucket_cap_bytes);
    if (!fits) {
      b = bucket_params_.size();
      bucket_params_.emplace_back();
      sizes.push_back(0);
      std::erase_if(open, [&](const auto& o) { return o.first == key; });
      open.emplace_back(key, b);
    }
    slots_[k] = {b, sizes[b]};
    bucket_params_[b].push_back(k);
    sizes[b] += p.numel();
  }
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    const Tensor& first = params_[bucket_params_[b].front()];
    flat_.push_back(zeros({sizes[b]}, first.options()));
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t k = 0; k < params_.size(); ++k)
    params_[k].register_post_accumulate_grad_hook([weak, k](const Tensor&) {
      if (auto self = weak.lock()) self->on_gradient(k);
    });
}

Tensor Reducer::slot_view(size_t param) const {
  const Tensor& p = params_[param];
  return flat_[slots_[param].bucket].narrow(0, slots_[param].offset, p.numel()).view(p.shape());
}

void Reducer::set_comm_hook(CommHook hook) {
  constexpr const char* kOp = "[DistributedDataParallel::register_comm_hook]";
  STRATA_CHECK(hook != nullptr, "{} the hook is empty", kOp);
  STRATA_CHECK(comm_hook_ == nullptr, "{} a communication hook is registered already; it can be registered once only",
               kOp);
  STRATA_CHECK(!backward_seen_, "{} a backward pass has run already; register the hook before the first backward",
               kOp);
  comm_hook_ = std::move(hook);
}

GradBucket Reducer::make_bucket(size_t b) const {
  GradBucket bucket{b, b + 1 == bucket_params_.size(), {}, flat_[b], {}};
  for (size_t k : bucket_params_[b]) {
    bucket.parameters.push_back(params_[k]);
    bucket.offsets.push_back(slots_[k].offset);
  }
  return bucket;
}

void Reducer::reset() {
  // what the abandoned pass started, finished on every rank alike; its failures were that pass's
  // (its backward raised already), so they do not stop the next one
  for (auto& f : futures_) {
    try {
      if (f.defined()) f.wait();
    } catch (const std::exception&) {
    }
  }
  futures_.clear();
  in_backward_ = false;
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  outside_graph_.assign(params_.size(), false);
  if (!find_unused_) return;
  std::unordered_set<uint64_t> walked;
  std::unordered_set<const TensorImpl*> leaves;
  autograd::visit_leaves(outputs, walked, [&](const TensorImpl* leaf) { leaves.insert(leaf); });
  for (size_t k = 0; k < params_.size(); ++k) outside_graph_[k] = !leaves.count(params_[k].impl_ptr().get());
}

void Reducer::begin_backward() {
  in_backward_ = true;
  ready_.assign(params_.size(), false);
  got_gradient_.assign(params_.size(), false);
  pending_.clear();
  for (const auto& b : bucket_params_) pending_.push_back(b.size());
  futures_.assign(bucket_params_.size(), CommFuture());
  next_bucket_ = 0;
  started_during_backward_ = 0;
  std::weak_ptr<Reducer> weak = weak_from_this();
  auto alive = std::make_shared<bool>(true);
  pass_alive_ = alive;
  autograd::queue_callback([weak, alive] {
    if (auto self = weak.lock()) self->finish_backward();
  });
  for (size_t k = 0; k < outside_graph_.size() && k < params_.size(); ++k)
    if (outside_graph_[k]) absorb_missing(k);
}

void Reducer::absorb_missing(size_t param) {
  NoGradGuard no_grad;
  const Tensor& g = params_[param].grad();
  if (g.defined()) slot_view(param).copy_(g);
  else slot_view(param).zero_();
  ready_[param] = true;
  --pending_[slots_[param].bucket];
}

void Reducer::on_gradient(size_t param) {
  backward_seen_ = true;
  if (!sync) return;
  if (in_backward_ && pass_alive_.expired()) reset();  // the last pass raised before its end
  if (!in_backward_) begin_backward();
  STRATA_CHECK(!got_gradient_[param],
               "[DistributedDataParallel] parameter {} received its gradient twice in one backward pass; DDP reduces "
               "each gradient once per pass (use no_sync() for the passes that only accumulate)",
               param);
  STRATA_CHECK(!ready_[param],
               "[DistributedDataParallel] parameter {} got a gradient although the forward's graph did not reach it "
               "(find_unused_parameters): its gradient was counted as zero already",
               param);
  {
    NoGradGuard no_grad;
    slot_view(param).copy_(params_[param].grad());
  }
  got_gradient_[param] = true;
  ready_[param] = true;
  --pending_[slots_[param].bucket];
  const size_t before = next_bucket_;
  start_ready_buckets();
  started_during_backward_ += next_bucket_ - before;
}

void Reducer::start_ready_buckets() {
  while (next_bucket_ < bucket_params_.size() && pending_[next_bucket_] == 0) {
    const size_t b = next_bucket_++;
    if (!comm_hook_) {
      futures_[b] = CommFuture(flat_[b], group_->allreduce(flat_[b], ReduceOp::Avg));
      continue;
    }
    NoGradGuard no_grad;
    GradBucket bucket = make_bucket(b);
    futures_[b] = comm_hook_(bucket);
    STRATA_CHECK(futures_[b].defined(), "[DistributedDataParallel] the communication hook returned an empty future "
                                        "for bucket {}", b);
  }
}

void Reducer::take_result(size_t b) {
  const Tensor result = futures_[b].wait();
  if (result.is_same(flat_[b])) return;
  STRATA_CHECK(result.defined() && result.numel() == flat_[b].numel() && result.device() == flat_[b].device(),
               "[DistributedDataParallel] the communication hook's future for bucket {} holds {}, expected a tensor "
               "of {} elements on {} (the bucket's buffer)",
               b, result.defined() ? fmt::format("{} {} on {}", result.shape(), result.dtype(), result.device())
                                   : std::string("an undefined tensor"),
               flat_[b].numel(), flat_[b].device());
  flat_[b].copy_(result.reshape({result.numel()}));
}

void Reducer::finish_backward() {
  in_backward_ = false;
  NoGradGuard no_grad;
  // the gradients that never arrived: what .grad holds (accumulated under no_sync), or zeros
  std::vector<int32_t> used_here(params_.size(), 0);
  for (size_t k = 0; k < params_.size(); ++k) {
    used_here[k] = got_gradient_[k] || params_[k].grad().defined();
    if (!ready_[k]) absorb_missing(k);
  }
  start_ready_buckets();
  if (find_unused_) {  // after every bucket, so the ranks issue the same collectives in order
    Tensor used = from_vector(used_here).to(params_.front().device());
    group_->allreduce(used, ReduceOp::Max)->wait();
    Tensor host = used.cpu();
    std::copy_n(host.data_ptr<int32_t>(), host.numel(), used_here.begin());
  }
  // bucket by bucket, so a bucket hook works on one while the later ones are still reduced;
  // after a failure the remaining buckets are still waited for and written
  std::exception_ptr error;
  for (size_t b = 0; b < futures_.size(); ++b) {
    try {
      take_result(b);
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    for (size_t k : bucket_params_[b]) {
      if (find_unused_ && used_here[k] == 0) continue;  // unused on every rank: .grad untouched
      const Tensor& g = params_[k].grad();
      if (g.defined()) g.copy_(slot_view(k));
      else params_[k].set_grad(slot_view(k).clone());
    }
    if (!bucket_hook || error) continue;
    try {
      bucket_hook(make_bucket(b));
    } catch (...) {
      error = std::current_exception();
    }
  }
  futures_.clear();
  if (error) std::rethrow_exception(error);
}

}  // namespace strata::dist::detail
