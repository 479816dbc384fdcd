// Process groups: the collectives every rank of a job calls together (PyTorch's c10d
// ProcessGroup and torch.distributed's functions). A backend implements the `*_impl` hooks on
// contiguous tensors; the public methods check the arguments once for every backend, work on
// a contiguous copy of a strided tensor and write the result back when the Work completes.
//
//   dist::init_process_group("mpi");            // launched as: mpirun -np 4 ./train
//   Tensor g = ...;
//   dist::all_reduce(g, dist::ReduceOp::Avg);   // every rank now holds the mean
//   auto work = dist::all_reduce(g, dist::ReduceOp::Sum, nullptr, /*async_op=*/true);
//   ...                                          // overlap other work
//   work->wait();
//
// Backends: "mpi" (CPU tensors, STRATA_WITH_MPI) and "nccl" (CUDA tensors, STRATA_WITH_CUDA with
// NCCL found, bootstrapped over MPI). A build without them keeps this header; calling them
// raises strata::Error naming the build option.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata::dist {

/// How allreduce and reduce_scatter combine the ranks' values. Avg needs a floating dtype; on
/// bool, Sum and Max are a logical or, Product and Min a logical and (as NCCL's).
enum class ReduceOp : uint8_t { Sum, Avg, Product, Max, Min };

/// A handle on an operation in flight. wait() blocks until it has finished and its result is
/// in the output tensors (and rethrows a failure); is_completed() polls whether the communication
/// is over (the write-back into the caller's tensors happens in wait()). Waiting twice, or from
/// two threads, is fine.
class STRATA_API Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
};

/// A Work whose backend part finishes on another thread (or stream) and whose `finish` step
/// (writing results back into the caller's tensors) runs on the thread that waits for it.
class STRATA_API FutureWork : public Work {
 public:
  explicit FutureWork(std::function<void()> finish = {}) : finish_(std::move(finish)) {}
  bool is_completed() override;
  void wait() override;
  /// Called by the backend when its part is over; `error` null on success.
  void mark_done(std::exception_ptr error = nullptr);

 protected:
  /// Blocks until the backend part is over (the default waits for mark_done).
  virtual void wait_backend();
  virtual bool backend_done();

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  // held while `finish` runs, so a second waiter returns only once the results are written
  std::mutex finish_mutex_;
  bool finished_ = false;
  std::function<void()> finish_;
};

/// A group of processes that run collectives together. Every rank must call the same
/// collectives in the same order with matching shapes and dtypes; what can be checked locally
/// (device, dtype, shape agreement between a call's own tensors, ranks in range) raises
/// strata::Error before anything is sent.
class STRATA_API ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi" or "nccl".
  virtual std::string backend() const = 0;

  /// Each rank's `tensor` becomes the reduction over all ranks, in place.
  std::shared_ptr<Work> allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  /// Every rank's `tensor` becomes `root`'s.
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root);
  /// outputs[r] becomes rank r's `input`; outputs holds size() tensors of input's shape and dtype.
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs, const Tensor& input);
  /// `output` becomes the reduction over ranks of their inputs[rank()]; inputs holds size()
  /// tensors of output's shape and dtype.
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::Sum);
  /// Completes once every rank has entered it.
  std::shared_ptr<Work> barrier();
  /// Point to point: `tensor` goes to rank `dst`, which receives it with recv(src, same tag).
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0);

 protected:
  /// The hooks below see contiguous tensors of the backend's device, already checked. A float16
  /// or bfloat16 reduction reaches allreduce_impl and reduce_scatter_impl as float32 (see
  /// Note [Half reductions] in src/dist/process_group.cpp); Avg arrives as Sum, divided after.
  virtual std::shared_ptr<FutureWork> allreduce_impl(const Tensor& t, ReduceOp op,
                                                     std::function<void()> finish) = 0;
  virtual std::shared_ptr<FutureWork> broadcast_impl(const Tensor& t, int root, std::function<void()> finish) = 0;
  /// `gathered` holds size() * input.numel() elements: rank r's input at r * input.numel().
  virtual std::shared_ptr<FutureWork> allgather_impl(const Tensor& gathered, const Tensor& input,
                                                     std::function<void()> finish) = 0;
  /// `stacked` holds size() * output.numel() elements, the part for rank r at r * output.numel().
  virtual std::shared_ptr<FutureWork> reduce_scatter_impl(const Tensor& output, const Tensor& stacked, ReduceOp op,
                                                          std::function<void()> finish) = 0;
  virtual std::shared_ptr<FutureWork> barrier_impl() = 0;
  virtual std::shared_ptr<FutureWork> send_impl(const Tensor& t, int dst, int tag, std::function<void()> finish) = 0;
  virtual std::shared_ptr<FutureWork> recv_impl(const Tensor& t, int src, int tag, std::function<void()> finish) = 0;
  /// The device type this backend's tensors must be on, and the largest tag it accepts.
  virtual DeviceType device_type() const = 0;
  virtual int max_tag() const = 0;

 private:
  void check_tensor(const char* op, const Tensor& t) const;
  void check_peer(const char* op, int peer, const char* what) const;
};

/// Creates the default group: "mpi" (rank and size from the MPI launcher) or "nccl" (one CUDA
/// device per rank, device local_rank % device_count, made the current device; bootstrapped over
/// MPI). Raises if one exists already or the backend is not in this build.
STRATA_API void init_process_group(const std::string& backend);
/// Drops the default group (MPI itself is finalized when the process exits).
STRATA_API void destroy_process_group();
STRATA_API bool is_initialized();
/// The default group; raises if init_process_group was not called.
STRATA_API std::shared_ptr<ProcessGroup> default_group();
STRATA_API int get_rank();
STRATA_API int get_world_size();
/// Whether this build has the backend ("mpi", "nccl").
STRATA_API bool is_available(const std::string& backend);

/// A new group over all ranks of MPI's world with its own communicator (so its traffic never
/// mixes with the default group's). Raises naming STRATA_WITH_MPI in a build without MPI.
STRATA_API std::shared_ptr<ProcessGroup> new_mpi_group();
/// A NCCL group over all ranks, on CUDA device `device`. Raises naming the build option in a
/// build without NCCL.
STRATA_API std::shared_ptr<ProcessGroup> new_nccl_group(int device);

// torch.distributed's functions. `group` defaults to the default group; with async_op they
// return the Work to wait on, otherwise they wait and return nullptr.
STRATA_API std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum,
                                            std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
STRATA_API std::shared_ptr<Work> broadcast(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr,
                                           bool async_op = false);
STRATA_API std::shared_ptr<Work> all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                                            std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
STRATA_API std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list,
                                                ReduceOp op = ReduceOp::Sum,
                                                std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
STRATA_API void barrier(std::shared_ptr<ProcessGroup> group = nullptr);
STRATA_API void send(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
STRATA_API void recv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
STRATA_API std::shared_ptr<Work> isend(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group = nullptr,
                                       int tag = 0);
STRATA_API std::shared_ptr<Work> irecv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr,
                                       int tag = 0);

}  // namespace strata::dist
