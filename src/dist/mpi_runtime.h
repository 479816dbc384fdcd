// MPI's process-wide state shared by the MPI process group and the NCCL bootstrap: one
// initialization, one lock around every MPI call, and one communication thread that runs the
// collectives in the order they were issued (see Note [MPI threads] in mpi_runtime.cpp).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <mutex>

#include <strata/dist/process_group.hpp>

namespace strata::dist::detail {

/// Initializes MPI on first use (unless the program did) and finalizes it at exit.
void ensure_mpi();
/// The lock every MPI call is made under.
std::mutex& mpi_mutex();
/// Raises strata::Error naming the MPI call `what` and MPI's message when rc is not MPI_SUCCESS.
void mpi_check(int rc, const char* what);
/// Runs `task` on the communication thread, after every task submitted before it.
void mpi_enqueue(std::function<void()> task);
/// Runs `call` (a blocking MPI collective) on the communication thread under the MPI lock, after
/// every task submitted before it, and marks `work` done (or failed with what `call` raised). A
/// watchdog fails `work` with its timeout error (FutureWork::expire) once its deadline passes;
/// the call itself goes on (Note [Collective timeouts] in mpi_runtime.cpp).
void mpi_run_collective(std::shared_ptr<FutureWork> work, std::function<void()> call);
/// Runs `call` on the communication thread under the MPI lock, after every task submitted before
/// it, and waits for it (rethrowing what it raised). Collectives over MPI_COMM_WORLD (creating a
/// communicator, the NCCL bootstrap) go through it: made on the caller's thread, they could take
/// the lock before an allreduce already queued here while another rank's allreduce holds it.
void mpi_run_sync(const std::function<void()>& call);
/// This process's rank among the ranks on its own node.
int mpi_local_rank();

}  // namespace strata::dist::detail
