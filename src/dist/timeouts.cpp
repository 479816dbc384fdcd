// Timeouts of process groups (PyTorch's `timeout=` of init_process_group and new_group): the
// Work every backend returns (FutureWork), which waits up to a deadline, and the group state
// that numbers operations and records that a timeout made the group unusable.
//
// Note [Timed-out groups]: once an operation has timed out, the ranks no longer agree on which
// collectives were called: MPI cannot cancel a collective, and its request stays posted (the
// communication thread polls it until it completes, should the late rank ever call it), and
// NCCL's communicator is aborted. Every later operation on the group raises rather than
// matching the wrong peer operation; the process is expected to exit, as PyTorch aborts it.
#include <cerrno>
#include <cstdlib>

#include <fmt/ranges.h>

#include <strata/autograd/grad_mode.hpp>
#include <strata/dist/process_group.hpp>

namespace strata::dist {

namespace {

using std::chrono::milliseconds;

// start + timeout, saturating instead of overflowing for huge timeouts
FutureWork::Clock::time_point add(FutureWork::Clock::time_point start, milliseconds timeout) {
  const auto room = std::chrono::duration_cast<milliseconds>(FutureWork::Clock::time_point::max() - start);
  return timeout >= room ? FutureWork::Clock::time_point::max() : start + timeout;
}

}  // namespace

// ---- FutureWork ------------------------------------------------------------------------------

void FutureWork::mark_done(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    done_ = true;
    error_ = error;
  }
  done_cv_.notify_all();
}

bool FutureWork::backend_done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool FutureWork::wait_backend(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (deadline == Clock::time_point::max()) {
    done_cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return done_cv_.wait_until(lock, deadline, [&] { return done_; });
}

bool FutureWork::failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ && error_;
}

// a Work failed by a timeout is over, whatever the backend's request says
bool FutureWork::is_completed() { return failed() || backend_done(); }

void FutureWork::set_timeout(milliseconds timeout, OnTimeout on_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  start_ = Clock::now();
  timeout_ = timeout;
  on_timeout_ = std::move(on_timeout);
}

FutureWork::Clock::time_point FutureWork::deadline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeout_ ? add(start_, *timeout_) : Clock::time_point::max();
}

void FutureWork::expire() {
  milliseconds timeout{0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!timeout_) return;
    timeout = *timeout_;
  }
  expire(timeout);
}

void FutureWork::expire(milliseconds timeout) {
  OnTimeout on_timeout;
  Clock::time_point start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    on_timeout = on_timeout_;
    start = start_;
  }
  const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  std::exception_ptr error =
      on_timeout ? on_timeout(waited, timeout)
                 : std::make_exception_ptr(Error(fmt::format(
                       "[wait] the operation ran for {} ms without completing, past its timeout of {} ms",
                       waited.count(), timeout.count())));
  mark_done(error);
}

void FutureWork::wait() {
  std::optional<milliseconds> timeout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeout = timeout_;
  }
  if (timeout) wait(*timeout);
  else wait_until(Clock::time_point::max(), milliseconds(0));
}

void FutureWork::wait(milliseconds timeout) {
  STRATA_CHECK(timeout.count() > 0, "[wait] the timeout must be positive, got {} ms", timeout.count());
  Clock::time_point start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    start = start_;
  }
  wait_until(add(start, timeout), timeout);
}

void FutureWork::wait_until(Clock::time_point deadline, milliseconds timeout) {
  if (!failed() && !wait_backend(deadline)) expire(timeout);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }
  std::lock_guard<std::mutex> finishing(finish_mutex_);
  if (finished_) return;
  if (finish_) {
    NoGradGuard no_grad;  // writing results back is no op to record
    finish_();
  }
  finished_ = true;
  finish_ = nullptr;  // releases the working copies
}

// ---- the group's timeout and state -----------------------------------------------------------

milliseconds default_timeout() {
  const char* text = std::getenv("STRATA_DIST_TIMEOUT");
  if (!text || !*text) return std::chrono::minutes(30);  // PyTorch's default_pg_timeout
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  STRATA_CHECK(errno == 0 && end != text && *end == '\0' && seconds > 0 && seconds < 1e9,
               "[dist] STRATA_DIST_TIMEOUT must be a positive number of seconds (below 1e9), got '{}'", text);
  return std::max(milliseconds(1), milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5)));
}

namespace detail {
std::shared_ptr<GroupState> new_group_state() {
  auto state = std::make_shared<GroupState>();
  state->timeout = default_timeout();
  return state;
}
}  // namespace detail

milliseconds ProcessGroup::timeout() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->timeout;
}

void ProcessGroup::set_timeout(milliseconds timeout) {
  STRATA_CHECK(timeout.count() > 0, "[set_timeout] the timeout must be positive, got {} ms", timeout.count());
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->timeout = timeout;
}

bool ProcessGroup::is_broken() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->broken.empty();
}

void ProcessGroup::watch(FutureWork& work, const char* op) {
  uint64_t seq = 0;
  milliseconds timeout;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    seq = ++state_->seq;
    timeout = state_->timeout;
  }
  const std::vector<int> ranks = global_ranks();
  const int group_rank = rank();
  const int global_rank = ranks.at(static_cast<size_t>(group_rank));
  // as NCCL's watchdog: what timed out, in which group, on which rank, and for how long
  auto on_timeout = [state = state_, name = std::string(op), backend = backend(), ranks, group_rank, global_rank,
                     seq](milliseconds waited, milliseconds timeout) {
    std::string message = fmt::format(
        "[{}] timed out: operation SeqNum={} of the {} process group of global ranks [{}] ran for {} ms on group "
        "rank {} (global rank {}), past its timeout of {} ms; some rank did not call it (a rank that raised, or "
        "ranks that took different paths). The group is unusable from now on: exit the process",
        name, seq, backend, fmt::join(ranks, ", "), waited.count(), group_rank, global_rank, timeout.count());
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->broken.empty()) state->broken = message;
    }
    return std::make_exception_ptr(Error(message));
  };
  work.set_timeout(timeout, std::move(on_timeout));
}

void ProcessGroup::check_usable(const char* op) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->broken.empty()) return;
  ::strata::detail::throw_error("[{}] the process group is unusable: an earlier operation timed out ({})", op,
                                state_->broken);
}

}  // namespace strata::dist
