// CommFuture: a tensor behind a Work, with steps chained on it that run when it is waited for.
#include <mutex>

#include <strata/autograd/grad_mode.hpp>
#include <strata/dist/comm_hook.hpp>

namespace strata::dist {

struct CommFuture::State {
  std::mutex mutex;
  Tensor value;
  std::shared_ptr<Work> work;
  std::shared_ptr<State> parent;                // a chained step's input
  std::function<Tensor(const Tensor&)> step;  // makes this value from the parent's
  bool done = false;
  std::exception_ptr error;
};

CommFuture::CommFuture(Tensor value, std::shared_ptr<Work> work) : state_(std::make_shared<State>()) {
  state_->value = std::move(value);
  state_->work = std::move(work);
}

CommFuture CommFuture::then(std::function<Tensor(const Tensor&)> fn) const {
  STRATA_CHECK(defined(), "[CommFuture::then] the future is empty");
  STRATA_CHECK(fn != nullptr, "[CommFuture::then] the step is empty");
  CommFuture next;
  next.state_ = std::make_shared<State>();
  next.state_->parent = state_;
  next.state_->step = std::move(fn);
  return next;
}

Tensor CommFuture::wait() const {
  STRATA_CHECK(defined(), "[CommFuture::wait] the future is empty");
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  if (!s.done) {
    try {
      NoGradGuard no_grad;  // a reduction's arithmetic is no op to record
      if (s.parent) {
        CommFuture input;
        input.state_ = s.parent;
        s.value = s.step(input.wait());
      } else if (s.work) {
        s.work->wait();
      }
    } catch (...) {
      s.error = std::current_exception();
    }
    s.done = true;
    s.work = nullptr;
    s.parent = nullptr;  // releases what the chain held
    s.step = nullptr;
  }
  if (s.error) std::rethrow_exception(s.error);
  return s.value;
}

bool CommFuture::is_completed() const {
  if (!defined()) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

}  // namespace strata::dist
