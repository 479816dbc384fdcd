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

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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
/// two threads, is fine. An operation still unfinished once its group's timeout has passed since
/// it was issued fails with a strata::Error naming it (see docs/distributed.md, "Timeouts").
class STRATA_API Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
  /// As wait(), raising once `timeout` has passed since the operation was issued (as PyTorch's
  /// Work.wait(timeout)); the group's timeout still fails it first where that is shorter.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
};

/// A Work whose backend part finishes on another thread (or stream) and whose `finish` step
/// (writing results back into the caller's tensors) runs on the thread that waits for it.
class STRATA_API FutureWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;
  /// Builds the error of an operation that ran `waited` without completing (and marks its
  /// group unusable).
  using OnTimeout =
      std::function<std::exception_ptr(std::chrono::milliseconds waited, std::chrono::milliseconds timeout)>;

  explicit FutureWork(std::function<void()> finish = {}) : finish_(std::move(finish)) {}
  bool is_completed() override;
  void wait() override;
  void wait(std::chrono::milliseconds timeout) override;
  /// Called by the backend when its part is over; `error` null on success. Only the first call
  /// counts (a completion after a timeout changes nothing).
  void mark_done(std::exception_ptr error = nullptr);
  /// Gives the Work a timeout counted from now; wait() raises on_timeout's error past it.
  void set_timeout(std::chrono::milliseconds timeout, OnTimeout on_timeout);
  /// When the timeout runs out (Clock::time_point::max() without one).
  Clock::time_point deadline() const;
  /// Fails the Work with its timeout error, as a wait past the deadline does (for watchdogs);
  /// nothing when it has no timeout or is done already.
  void expire();

 protected:
  /// Blocks until the backend part is over or `deadline` passes; false when it passed first
  /// (the default waits for mark_done).
  virtual bool wait_backend(Clock::time_point deadline);
  virtual bool backend_done();
  /// Waits for the backend part up to `deadline` (then fails with a `timeout` error), rethrows a
  /// failure, and writes the results back.
  void wait_until(Clock::time_point deadline, std::chrono::milliseconds timeout);

 private:
  void expire(std::chrono::milliseconds timeout);
  bool failed();
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  Clock::time_point start_ = Clock::now();
  std::optional<std::chrono::milliseconds> timeout_;
  OnTimeout on_timeout_;
  // held while `finish` runs, so a second waiter returns only once the results are written
  std::mutex finish_mutex_;
  bool finished_ = false;
  std::function<void()> finish_;
};

class ProcessGroup;
namespace detail {
/// What a group's operations share with their Works: the timeout, the sequence number of the
/// last operation issued, and why the group became unusable (empty while it is usable).
struct GroupState {
  std::mutex mutex;
  std::chrono::milliseconds timeout;
  uint64_t seq = 0;
  std::string broken;
};
STRATA_API std::shared_ptr<GroupState> new_group_state();
/// Calls `parent`'s split_impl; a rank left out gets the refusing handle new_group documents.
std::shared_ptr<ProcessGroup> split_group(ProcessGroup& parent, int color, int key, std::vector<int> global_ranks);
}  // namespace detail

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
  /// The members' global ranks (their ranks in the default group), in group-rank order.
  virtual std::vector<int> global_ranks() const = 0;
  /// False for the handle new_group gives a rank outside the group: every operation raises.
  virtual bool is_member() const { return true; }
  /// How long an operation may run, from when it is issued, before waiting for it raises.
  std::chrono::milliseconds timeout() const;
  /// Applies to the operations issued from now on; must be positive.
  void set_timeout(std::chrono::milliseconds timeout);
  /// True once an operation of this group timed out: every later operation raises (MPI cannot
  /// cancel a collective, NCCL's communicator is aborted), and the process should exit.
  bool is_broken() const;

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
  /// `dst`'s `tensor` becomes the reduction over all ranks; the others' tensors are unchanged.
  std::shared_ptr<Work> reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::Sum);
  /// On `dst`, outputs[r] becomes rank r's `input` (outputs: size() tensors of input's shape and
  /// dtype); the other ranks pass no outputs.
  std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int dst);
  /// Each rank's `output` becomes `src`'s inputs[rank()] (inputs: size() tensors of output's
  /// shape and dtype, on `src` only; the other ranks pass none).
  std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int src);
  /// outputs[r] becomes rank r's inputs[rank()]; both hold size() tensors of one dtype, of any
  /// sizes (torch's all_to_all): outputs[r] must have as many elements as rank r sends this rank.
  /// Every rank's sizes are gathered first (one small allgather, waited for) and checked against
  /// each other, so a disagreement raises on every rank.
  std::shared_ptr<Work> alltoall(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs);
  /// Equal splits of dim 0: `input` is size() chunks along dim 0, chunk r going to rank r;
  /// `output` (input's shape and dtype) receives rank r's chunk rank() as its chunk r.
  std::shared_ptr<Work> alltoall_base(const Tensor& output, const Tensor& input);
  /// Split sizes (torch's all_to_all_single with output_split_sizes, input_split_sizes): the
  /// first input_split_sizes[0] rows (dim 0) of `input` go to rank 0, the next ones to rank 1...;
  /// `output`'s dim 0 receives output_split_sizes[r] rows from rank r, in rank order. An empty
  /// list splits that tensor's dim 0 into equal parts. Both tensors share dtype, device and every
  /// dim but 0. As for alltoall, every rank's split sizes are checked against the others' first:
  /// rank i's input_split_sizes[j] must be rank j's output_split_sizes[i].
  std::shared_ptr<Work> alltoall_base(const Tensor& output, const Tensor& input,
                                      const std::vector<int64_t>& output_split_sizes,
                                      const std::vector<int64_t>& input_split_sizes);
  /// Completes once every rank has entered it.
  std::shared_ptr<Work> barrier();
  /// Point to point: `tensor` goes to rank `dst`, which receives it with recv(src, same tag).
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0);

 protected:
  /// Backends call this as they issue an operation: numbers it (its sequence number) and gives
  /// `work` the group's timeout, past which its error names `op`, the group and this rank.
  void watch(FutureWork& work, const char* op);

  /// The hooks below see contiguous tensors of the backend's device, already checked. A float16
  /// or bfloat16 reduction reaches allreduce_impl, reduce_impl and reduce_scatter_impl as float32 (see
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
  /// `t` is reduced into on `dst` only; as allreduce_impl for half dtypes and Avg.
  virtual std::shared_ptr<FutureWork> reduce_impl(const Tensor& t, int dst, ReduceOp op,
                                                  std::function<void()> finish) = 0;
  /// On `dst`, `gathered` holds size() * input.numel() elements (undefined on the other ranks).
  virtual std::shared_ptr<FutureWork> gather_impl(const Tensor& gathered, const Tensor& input, int dst,
                                                  std::function<void()> finish) = 0;
  /// On `src`, `stacked` holds size() * output.numel() elements (undefined on the other ranks).
  virtual std::shared_ptr<FutureWork> scatter_impl(const Tensor& output, const Tensor& stacked, int src,
                                                   std::function<void()> finish) = 0;
  /// `output` and `input` hold size() equal chunks, chunk r of input going to rank r.
  virtual std::shared_ptr<FutureWork> alltoall_impl(const Tensor& output, const Tensor& input,
                                                    std::function<void()> finish) = 0;
  /// `input` holds input_counts[r] elements for rank r end to end, in rank order; `output`
  /// receives output_counts[r] elements from rank r the same way (counts already agreed).
  virtual std::shared_ptr<FutureWork> alltoallv_impl(const Tensor& output, const Tensor& input,
                                                     std::vector<int64_t> output_counts,
                                                     std::vector<int64_t> input_counts,
                                                     std::function<void()> finish) = 0;
  /// Collective over this group: splits it as MPI_Comm_split does (ranks with one `color` form a
  /// group, ordered by `key`); a negative color leaves this rank out (the result is null).
  /// `global_ranks` are the new group's members in their group-rank order.
  virtual std::shared_ptr<ProcessGroup> split_impl(int color, int key, std::vector<int> global_ranks) = 0;
  virtual std::shared_ptr<FutureWork> barrier_impl() = 0;
  virtual std::shared_ptr<FutureWork> send_impl(const Tensor& t, int dst, int tag, std::function<void()> finish) = 0;
  virtual std::shared_ptr<FutureWork> recv_impl(const Tensor& t, int src, int tag, std::function<void()> finish) = 0;
  /// The device type this backend's tensors must be on, and the largest tag it accepts.
  virtual DeviceType device_type() const = 0;
  virtual int max_tag() const = 0;

 private:
  friend std::shared_ptr<ProcessGroup> detail::split_group(ProcessGroup&, int, int, std::vector<int>);
  void check_tensor(const char* op, const Tensor& t) const;
  void check_list(const char* op, const char* what, const std::vector<Tensor>& list, const Tensor& like) const;
  void check_peer(const char* op, int peer, const char* what) const;
  void check_member(const char* op) const;
  /// Raises once an operation of the group timed out (Note [Timed-out groups]).
  void check_usable(const char* op) const;
  /// Gathers every rank's send and receive counts (`unit`: what they count) and whether its own
  /// checks raised (`local_error`), and raises on every rank alike where some rank's did (its
  /// error there, one naming it elsewhere) or where rank i's count for j is not j's for i.
  void check_counts_agree(const char* op, const char* unit, std::exception_ptr local_error,
                          const std::vector<int64_t>& output_counts, const std::vector<int64_t>& input_counts,
                          Device device);
  std::shared_ptr<detail::GroupState> state_ = detail::new_group_state();
};

/// PyTorch's default_pg_timeout, 30 minutes, unless the environment variable STRATA_DIST_TIMEOUT
/// gives another (in seconds, e.g. "600" or "1.5"); raises naming it when it is not a positive number.
STRATA_API std::chrono::milliseconds default_timeout();

/// Creates the default group: "mpi" (rank and size from the MPI launcher) or "nccl" (one CUDA
/// device per rank, device local_rank % device_count, made the current device; bootstrapped over
/// MPI). Raises if one exists already or the backend is not in this build. `timeout`: the
/// group's (ProcessGroup::timeout), default_timeout() when not given.
STRATA_API void init_process_group(const std::string& backend,
                                   std::optional<std::chrono::milliseconds> timeout = std::nullopt);
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

/// A group of the default group's ranks `ranks` (global ranks, any order; the group ranks
/// follow their sorted order), with the default group's backend and its own communicator.
/// Collective over the default group: every rank calls it, members or not, in the same order.
/// A rank outside `ranks` gets a handle whose rank() is -1 and whose operations raise.
/// `timeout`: the group's, default_timeout() when not given (as PyTorch, not the parent's).
STRATA_API std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                                   std::optional<std::chrono::milliseconds> timeout = std::nullopt);
/// torch.distributed's rank translation: the global rank of `group`'s rank `group_rank`, and
/// `global_rank`'s rank in `group` (raises when it is not a member).
STRATA_API int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank);
STRATA_API int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank);

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
STRATA_API std::shared_ptr<Work> reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::Sum,
                                        std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
/// `gather_list` on `dst` only (empty elsewhere), as torch.distributed.gather.
STRATA_API std::shared_ptr<Work> gather(const Tensor& tensor, const std::vector<Tensor>& gather_list, int dst,
                                        std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
/// `scatter_list` on `src` only (empty elsewhere), as torch.distributed.scatter.
STRATA_API std::shared_ptr<Work> scatter(const Tensor& tensor, const std::vector<Tensor>& scatter_list, int src,
                                         std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
STRATA_API std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& output_tensor_list,
                                            const std::vector<Tensor>& input_tensor_list,
                                            std::shared_ptr<ProcessGroup> group = nullptr, bool async_op = false);
/// torch.distributed.all_to_all_single with equal splits of dim 0.
STRATA_API std::shared_ptr<Work> all_to_all_single(const Tensor& output, const Tensor& input,
                                                   std::shared_ptr<ProcessGroup> group = nullptr,
                                                   bool async_op = false);
/// torch.distributed.all_to_all_single with output_split_sizes and input_split_sizes (rows of
/// dim 0 per rank; an empty list: equal splits), see ProcessGroup::alltoall_base.
STRATA_API std::shared_ptr<Work> all_to_all_single(const Tensor& output, const Tensor& input,
                                                   const std::vector<int64_t>& output_split_sizes,
                                                   const std::vector<int64_t>& input_split_sizes,
                                                   std::shared_ptr<ProcessGroup> group = nullptr,
                                                   bool async_op = false);
STRATA_API void barrier(std::shared_ptr<ProcessGroup> group = nullptr);
STRATA_API void send(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
STRATA_API void recv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
STRATA_API std::shared_ptr<Work> isend(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group = nullptr,
                                       int tag = 0);
STRATA_API std::shared_ptr<Work> irecv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr,
                                       int tag = 0);

}  // namespace strata::dist
