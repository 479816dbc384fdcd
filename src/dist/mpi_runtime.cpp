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
// Note [Polled collectives]: collectives are posted nonblocking (MPI_Iallreduce...) and the
// communication thread polls every request in flight with MPI_Test, so a collective that some
// rank never calls cannot hold the thread (and the lock) forever: past its deadline its Work
// fails with the timeout error and the thread goes on with the rest (Note [Timed-out groups]
// in timeouts.cpp). Polling spins while an operation is likely progressing, then sleeps (Backoff).
// At exit, MPI_Finalize would wait for a timed-out collective still posted: the job is aborted
// instead, as PyTorch aborts a process whose collective timed out.
#include "dist/mpi_runtime.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <list>
#include <thread>

#include <strata/core/error.hpp>

#include "dist/backoff.h"

namespace strata::dist::detail {

namespace {

class CommThread {
 public:
  CommThread() : thread_([this] { loop(); }) {}
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      STRATA_CHECK(!stopping_, "[dist] MPI is being finalized: no more operations can start");
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Runs what is queued and waits for the operations in flight (each completes or times out),
  // then ends the thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      stopping_since_ = Clock::now();
    }
    cv_.notify_one();
    thread_.join();
  }

  // Posts `post`'s operation (on the thread, in order with the tasks) and polls it.
  void post(std::shared_ptr<FutureWork> work, std::function<MPI_Request()> post) {
    enqueue([this, work, post = std::move(post)]() mutable {
      try {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        MPI_Request request = post();
        in_flight_.push_back(InFlight{request, work, std::move(post), false});
      } catch (...) {
        work->mark_done(std::current_exception());
      }
    });
  }
  // Whether an operation that timed out is still posted (set once the thread has ended).
  bool abandoned() const { return abandoned_; }

 private:
  struct InFlight {
    MPI_Request request;
    std::shared_ptr<FutureWork> work;
    std::function<MPI_Request()> post;  // holds the buffers until the request completes
    bool expired;
  };

  void loop() {
    Backoff backoff;
    for (;;) {
      std::deque<std::function<void()>> batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        const bool live = has_live();
        if (in_flight_.empty()) {
          cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        } else if (tasks_.empty()) {
          // only timed-out operations left: they are polled seldom
          const auto pause = live ? backoff.next() : std::chrono::microseconds(stopping_ ? 1000 : 10000);
          if (pause.count() == 0) {
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
          } else {
            cv_.wait_for(lock, pause, [&] { return !tasks_.empty(); });
          }
        }
        batch.swap(tasks_);
        if (batch.empty() && stopping_ && !has_live()) {
          // a timed-out operation the late rank did call may still be completing: a last grace
          if (in_flight_.empty() || Clock::now() - stopping_since_ > kExitGrace) {
            abandoned_ = !in_flight_.empty();
            return;
          }
        }
      }
      if (!batch.empty()) backoff.reset();
      for (auto& task : batch) task();  // tasks catch their own errors and hand them to their Work
      if (poll()) backoff.reset();
    }
  }

  // Tests every request in flight; true when one completed.
  bool poll() {
    bool progressed = false;
    std::lock_guard<std::mutex> lock(mpi_mutex());
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      int flag = 0;
      try {
        mpi_check(MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      } catch (...) {
        it->work->mark_done(std::current_exception());
        flag = 1;
      }
      if (flag) {
        it->work->mark_done();  // no effect after a timeout or an error
        it = in_flight_.erase(it);
        progressed = true;
        continue;
      }
      if (!it->expired && std::chrono::steady_clock::now() >= it->work->deadline()) {
        it->work->expire();
        it->expired = true;
      }
      ++it;
    }
    return progressed;
  }

  bool has_live() const {
    for (const InFlight& op : in_flight_)
      if (!op.expired) return true;
    return false;
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::list<InFlight> in_flight_;  // the thread's own
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kExitGrace{1};
  bool stopping_ = false;
  Clock::time_point stopping_since_;
  bool abandoned_ = false;
  std::thread thread_;
};

std::once_flag g_init_once;
bool g_we_initialized = false;
CommThread* g_comm_thread = nullptr;  // never deleted: at_exit stops it before MPI_Finalize

void at_exit() {
  if (g_comm_thread) g_comm_thread->stop();
  std::lock_guard<std::mutex> lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && g_comm_thread && g_comm_thread->abandoned()) {
    std::fputs("strata: exiting with a timed-out collective still posted; MPI cannot cancel it and MPI_Finalize "
               "would wait for it: aborting the MPI job\n",
               stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
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

void mpi_post(std::shared_ptr<FutureWork> work, std::function<MPI_Request()> post) {
  ensure_mpi();
  g_comm_thread->post(std::move(work), std::move(post));
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
