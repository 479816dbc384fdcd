// MPI's initialization, lock and communication thread.
//
// Note [MPI threads]: collectives run on one communication thread, so a training loop can go
// on computing (the backward pass, for DDP) while they progress; point-to-point requests are
// posted and polled from the caller's thread. Every MPI call, on either thread, is made under
// one process-wide mutex, so MPI is never entered by two threads at once: MPI_THREAD_SERIALIZED
// is exactly the guarantee needed. MPI_THREAD_MULTIPLE would add locking inside MPI on every
// call (and some OpenMPI builds lack it); FUNNELED would not allow the second thread at all.
// Collectives run in submission order on every rank, which is the order MPI requires.
#include "dist/mpi_runtime.h"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <thread>

#include <strata/core/error.hpp>

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
  // Runs what is queued, then ends the thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // tasks catch their own errors and hand them to their Work
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
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
