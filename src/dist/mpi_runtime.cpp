// MPI's initialization, lock and communication thread.
//
// Note [MPI threads]: collectives run on one communication thread, so a training loop can go
// on computing (the backward pass, for DDP) while they progress; point-to-point requests are
// posted and polled from the caller's thread. Every MPI call, on either thread, is made under
// one process-wide mutex, so MPI is never entered by two threads at once: MPI_THREAD_SERIALIZED
// is exactly the guarantee needed. MPI_THREAD_MULTIPLE would add locking inside MPI on every
// call (and some OpenMPI builds lack it); FUNNELED would not allow the second thread at all.
// Collectives run in submission order on every rank, which is the order MPI requires.
//
// Note [Collective timeouts]: the communication thread makes the blocking MPI call
// (MPI_Allreduce...), the fastest path (a nonblocking collective polled with MPI_Test is much
// slower in common MPIs); the deadline is kept on the waiting side. Work::wait waits for the
// call's completion up to the deadline and then fails with the timeout error (Note [Timed-out
// groups] in timeouts.cpp); a watchdog thread fails a Work nobody waits for once its deadline
// passes. The timed-out call stays blocked inside MPI (MPI cannot cancel a collective): should
// the late rank call it, it completes; until then the thread runs nothing else, so every later
// MPI collective of this process waits behind it (and times out in turn). At exit, with the
// thread still inside a timed-out call, MPI_Finalize would wait for it: the job is aborted
// instead, as PyTorch aborts a process whose collective timed out.
#include "dist/mpi_runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <list>
#include <memory>
#include <optional>
#include <thread>

#include <strata/core/error.hpp>

namespace strata::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

class CommThread {
 public:
  CommThread() : thread_([this] { loop(); }), watchdog_([this] { watch(); }) {}
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      STRATA_CHECK(!stopping_, "[dist] MPI is being finalized: no more operations can start");
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Queues the blocking collective `call`, whose `work` the watchdog fails past its deadline.
  void run_collective(std::shared_ptr<FutureWork> work, std::function<void()> call) {
    enqueue([this, work, call = std::move(call)] {
      set_running(work);
      try {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        call();
        work->mark_done();  // no effect once it timed out
      } catch (...) {
        work->mark_done(std::current_exception());
      }
      set_running(nullptr);
    });
    const auto deadline = work->deadline();
    std::lock_guard<std::mutex> lock(watch_mutex_);
    // the works finish in order: dropping the finished ones at the front keeps the list short
    while (!watched_.empty() && watched_.front()->is_completed()) watched_.pop_front();
    watched_.push_back(std::move(work));
    // the watchdog sleeps until its earliest deadline: woken only when this one is earlier
    if (deadline < watch_until_) watch_cv_.notify_one();
  }
  // Runs what is queued, then ends the thread; leaves it running (abandoned() true) when it is
  // stuck inside a call that timed out and has not completed after a grace period.
  void stop() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    cv_.notify_one();
    std::optional<Clock::time_point> stuck_since;
    while (!finished_) {
      if (running_ && running_->is_completed()) {  // running and failed: it timed out
        if (!stuck_since) stuck_since = Clock::now();
        // a timed-out call the late rank did make may still be completing: a last grace
        if (Clock::now() - *stuck_since > kExitGrace) {
          abandoned_ = true;
          return;
        }
      }
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    lock.unlock();
    thread_.join();
    {
      std::lock_guard<std::mutex> watching(watch_mutex_);
      watch_stop_ = true;
    }
    watch_cv_.notify_one();
    watchdog_.join();
  }
  // Whether stop() left the thread inside a timed-out call.
  bool abandoned() {
    std::lock_guard<std::mutex> lock(mutex_);
    return abandoned_;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) {
          finished_ = true;
          return;
        }
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // tasks catch their own errors and hand them to their Work
    }
  }
  void set_running(std::shared_ptr<FutureWork> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = std::move(work);
  }
  // The watchdog: fails every watched Work whose deadline passed, sleeping until the next one.
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!watch_stop_) {
      watch_until_ = Clock::time_point::max();
      for (auto it = watched_.begin(); it != watched_.end();) {
        const auto deadline = (*it)->deadline();
        if (!(*it)->is_completed() && Clock::now() >= deadline) (*it)->expire();
        if ((*it)->is_completed()) {
          it = watched_.erase(it);
          continue;
        }
        watch_until_ = std::min(watch_until_, deadline);
        ++it;
      }
      if (watch_until_ == Clock::time_point::max()) watch_cv_.wait(lock);
      else watch_cv_.wait_until(lock, watch_until_);
    }
  }

  static constexpr std::chrono::seconds kExitGrace{1};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::shared_ptr<FutureWork> running_;  // the collective the thread is in
  bool stopping_ = false;
  bool finished_ = false;
  bool abandoned_ = false;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::list<std::shared_ptr<FutureWork>> watched_;  // the collectives not known to be over
  Clock::time_point watch_until_ = Clock::time_point::max();
  bool watch_stop_ = false;
  std::thread thread_;
  std::thread watchdog_;
};

std::once_flag g_init_once;
bool g_we_initialized = false;
CommThread* g_comm_thread = nullptr;  // never deleted: at_exit stops it before MPI_Finalize

void at_exit() {
  if (g_comm_thread) g_comm_thread->stop();
  if (g_comm_thread && g_comm_thread->abandoned()) {
    // the communication thread holds the MPI lock inside the timed-out call: not taken here
    std::fputs("strata: exiting with a timed-out collective still in flight; MPI cannot cancel it and MPI_Finalize "
               "would wait for it: aborting the MPI job\n",
               stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::lock_guard<std::mutex> lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !finalized) MPI_Finalize();
}

void initialize() {
  mpi_mutex();  // constructed before at_exit is registered, so it outlives at_exit
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    g_we_initialized = true;
    STRATA_CHECK(provided >= MPI_THREAD_SERIALIZED,
                 "[dist] this MPI library offers thread level {}; strata needs MPI_THREAD_SERIALIZED ({})", provided,
                 static_cast<int>(MPI_THREAD_SERIALIZED));
  } else {
    int provided = 0;
    MPI_Query_thread(&provided);
    STRATA_CHECK(provided >= MPI_THREAD_SERIALIZED,
                 "[dist] MPI was initialized with thread level {}; strata needs MPI_THREAD_SERIALIZED: call "
                 "MPI_Init_thread with it, or let strata initialize MPI",
                 provided);
  }
  g_comm_thread = new CommThread();
  std::atexit(at_exit);
}

}  // namespace

std::mutex& mpi_mutex() {
  static std::mutex m;
  return m;
}

void ensure_mpi() {
  std::call_once(g_init_once, initialize);
}

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  ::strata::detail::throw_error("[dist] {} failed: {}", what, std::string(message, static_cast<size_t>(length)));
}

void mpi_enqueue(std::function<void()> task) {
  ensure_mpi();
  g_comm_thread->enqueue(std::move(task));
}

void mpi_run_collective(std::shared_ptr<FutureWork> work, std::function<void()> call) {
  ensure_mpi();
  g_comm_thread->run_collective(std::move(work), std::move(call));
}

void mpi_run_sync(const std::function<void()>& call) {
  std::promise<void> done;
  std::future<void> result = done.get_future();
  mpi_enqueue([&call, &done] {
    try {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      call();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  result.get();
}

int mpi_local_rank() {
  int rank = 0;
  mpi_run_sync([&rank] {
    MPI_Comm local;
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
              "MPI_Comm_split_type");
    MPI_Comm_rank(local, &rank);
    MPI_Comm_free(&local);
  });
  return rank;
}

}  // namespace strata::dist::detail
