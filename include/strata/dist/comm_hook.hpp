// What a DDP communication hook works with (PyTorch's GradBucket and torch.futures.Future):
// the bucket it reduces, and the future of the reduced flat buffer it returns. The hooks
// themselves, and DistributedDataParallel::register_comm_hook, are in ddp_comm_hooks.hpp and
// ddp.hpp; docs/distributed.md ("Communication hooks") explains how DDP calls them.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <strata/dist/process_group.hpp>

namespace strata::dist {

/// One of DDP's gradient buckets. A communication hook sees it before its reduction, with the
/// rank's local gradients in `buffer`; a bucket hook (register_bucket_hook) sees it after, with
/// the reduced gradients in `buffer` and in the parameters' .grad.
struct GradBucket {
  size_t index;                    // launch order, 0 first
  bool is_last;                    // the backward's last bucket
  std::vector<Tensor> parameters;  // its parameters
  Tensor buffer;                   // flat, 1-d: every parameter's gradient end to end
  std::vector<int64_t> offsets;    // where parameter i's gradient starts in buffer, in elements

  /// Parameter i's gradient as a view of `buffer`, shaped as the parameter (torch's gradients()).
  Tensor gradient(size_t i) const {
    return buffer.narrow(0, offsets.at(i), parameters.at(i).numel()).view(parameters[i].shape());
  }
  std::vector<Tensor> gradients() const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < parameters.size(); ++i) out.push_back(gradient(i));
    return out;
  }
};

/// A tensor that holds its value once the communication behind it is over (torch.futures.Future
/// of a Tensor, as a communication hook returns it). `then` chains a step on the value; the
/// steps run on the thread that waits, in chain order, once each, so every rank runs a hook's
/// later collectives in the order it waits for its futures (DDP waits in bucket order).
class STRATA_API CommFuture {
 public:
  CommFuture() = default;
  /// The future of `value`, complete once `work` (null: already complete) is waited for.
  explicit CommFuture(Tensor value, std::shared_ptr<Work> work = nullptr);
  /// The future of what `fn` makes of this future's value.
  CommFuture then(std::function<Tensor(const Tensor&)> fn) const;
  /// Waits for the work and runs the chained steps (once; later calls return the same value),
  /// and returns the value. A failure is rethrown, by this and every later wait.
  Tensor wait() const;
  /// Whether wait() has run to its end already.
  bool is_completed() const;
  bool defined() const { return state_ != nullptr; }

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// What DDP calls for each bucket: the hook bound to its state.
using CommHook = std::function<CommFuture(GradBucket&)>;

}  // namespace strata::dist
