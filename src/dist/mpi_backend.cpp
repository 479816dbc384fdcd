// The MPI process group, for CPU tensors. Collectives run on the communication thread (Note
// [MPI threads] in mpi_runtime.cpp) on the contiguous tensors ProcessGroup hands over;
// send and recv post MPI_Isend / MPI_Irecv at once and their Work polls the request. Every
// operation has the group's timeout (timeouts.cpp).
#include <climits>
#include <thread>

#include "dist/backends.h"
#include "dist/backoff.h"
#include "dist/mpi_runtime.h"

namespace strata::dist {

namespace {

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case kBool: return MPI_C_BOOL;
    case kUInt8: return MPI_UINT8_T;
    case kInt8: return MPI_INT8_T;
    case kInt32: return MPI_INT32_T;
    case kInt64: return MPI_INT64_T;
    case kFloat16: case kBFloat16: return MPI_UINT16_T;  // moved, never reduced (Note [Half reductions])
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

// bool has no arithmetic in MPI: its sum and max are a logical or, its product and min an and.
MPI_Op mpi_op(ReduceOp op, DType d) {
  const bool logical = d == kBool;
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: return logical ? MPI_LOR : MPI_SUM;
    case ReduceOp::Product: return logical ? MPI_LAND : MPI_PROD;
    case ReduceOp::Max: return logical ? MPI_LOR : MPI_MAX;
    case ReduceOp::Min: return logical ? MPI_LAND : MPI_MIN;
  }
  return MPI_OP_NULL;
}

int mpi_count(const Tensor& t) {
  STRATA_CHECK(t.numel() <= INT_MAX, "[dist] the MPI backend moves at most {} elements in one call, got {}", INT_MAX,
               t.numel());
  return static_cast<int>(t.numel());
}

// Buffers of point-to-point requests dropped before they completed (guarded by the MPI lock).
std::vector<Tensor>& orphaned_buffers() {
  static auto* buffers = new std::vector<Tensor>();  // never freed: MPI may write into them until exit
  return *buffers;
}

// A point-to-point request: done once MPI_Test says so. Polls with the lock released in
// between, so the communication thread's collectives go on meanwhile.
class RequestWork final : public FutureWork {
 public:
  RequestWork(MPI_Request request, bool is_recv, Tensor keep, std::function<void()> finish)
      : FutureWork(std::move(finish)), request_(request), is_recv_(is_recv), keep_(std::move(keep)) {}
  ~RequestWork() override {
    // Dropped before it completed: a receive is cancelled (so it cannot take a later message);
    // a send goes on in MPI's hands, and its buffer is kept for the rest of the process instead
    // of waiting here, which could hang.
    std::lock_guard<std::mutex> lock(detail::mpi_mutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || request_ == MPI_REQUEST_NULL) return;
    int flag = 0;
    if (MPI_Test(&request_, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return;
    if (is_recv_) {
      MPI_Cancel(&request_);
      MPI_Wait(&request_, MPI_STATUS_IGNORE);
      return;
    }
    MPI_Request_free(&request_);
    orphaned_buffers().push_back(std::move(keep_));
  }

 protected:
  bool backend_done() override {
    std::lock_guard<std::mutex> lock(detail::mpi_mutex());
    return test();
  }
  bool wait_backend(Clock::time_point deadline) override {
    detail::Backoff backoff;
    for (;;) {
      {
        // not blocking on the lock: the communication thread may hold it inside a collective
        // that never completes, and this wait must still end at its deadline
        std::unique_lock<std::mutex> lock(detail::mpi_mutex(), std::try_to_lock);
        if (lock.owns_lock() && test()) return true;
      }
      if (Clock::now() >= deadline) return false;
      backoff.pause(deadline);
    }
  }

 private:
  // Whether the request completed (under the MPI lock).
  bool test() {
    if (request_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    detail::mpi_check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }
  MPI_Request request_;
  bool is_recv_;
  Tensor keep_;  // the buffer MPI reads or writes until the request completes
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  // A group over MPI's world, with its own communicator.
  MpiProcessGroup() {
    detail::mpi_run_sync([this] {  // collective over MPI's world: in order with the others
      detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
      adopt();
    });
    for (int r = 0; r < size_; ++r) global_ranks_.push_back(r);
  }
  // A group over `comm`, made by the caller (on the communication thread).
  MpiProcessGroup(MPI_Comm comm, std::vector<int> global_ranks) : comm_(comm), global_ranks_(std::move(global_ranks)) {
    adopt();
  }
  ~MpiProcessGroup() override {
    MPI_Comm comm = comm_;
    try {  // after every operation already queued; skipped when MPI is finalized at exit
      detail::mpi_enqueue([comm]() mutable {
        std::lock_guard<std::mutex> lock(detail::mpi_mutex());
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm);
      });
    } catch (...) {
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::vector<int> global_ranks() const override { return global_ranks_; }

 protected:
  DeviceType device_type() const override { return DeviceType::CPU; }
  int max_tag() const override { return max_tag_; }

  std::shared_ptr<FutureWork> allreduce_impl(const Tensor& t, ReduceOp op, std::function<void()> finish) override {
    const int n = mpi_count(t);
    MPI_Comm comm = comm_;
    return run("all_reduce", std::move(finish), [t, n, op, comm] {
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, t.data(), n, mpi_type(t.dtype()), mpi_op(op, t.dtype()), comm),
                        "MPI_Allreduce");
    });
  }
  std::shared_ptr<FutureWork> broadcast_impl(const Tensor& t, int root, std::function<void()> finish) override {
    const int n = mpi_count(t);
    MPI_Comm comm = comm_;
    return run("broadcast", std::move(finish), [t, n, root, comm] {
      detail::mpi_check(MPI_Bcast(t.data(), n, mpi_type(t.dtype()), root, comm), "MPI_Bcast");
    });
  }
  std::shared_ptr<FutureWork> allgather_impl(const Tensor& gathered, const Tensor& input,
                                             std::function<void()> finish) override {
    const int n = mpi_count(input);
    mpi_count(gathered);
    MPI_Comm comm = comm_;
    return run("all_gather", std::move(finish), [gathered, input, n, comm] {
      const MPI_Datatype type = mpi_type(input.dtype());
      detail::mpi_check(MPI_Allgather(input.data(), n, type, gathered.data(), n, type, comm), "MPI_Allgather");
    });
  }
  std::shared_ptr<FutureWork> reduce_scatter_impl(const Tensor& output, const Tensor& stacked, ReduceOp op,
                                                  std::function<void()> finish) override {
    const int n = mpi_count(output);
    mpi_count(stacked);
    MPI_Comm comm = comm_;
    return run("reduce_scatter", std::move(finish), [output, stacked, n, op, comm] {
      detail::mpi_check(MPI_Reduce_scatter_block(stacked.data(), output.data(), n, mpi_type(output.dtype()),
                                                 mpi_op(op, output.dtype()), comm),
                        "MPI_Reduce_scatter_block");
    });
  }
  std::shared_ptr<FutureWork> reduce_impl(const Tensor& t, int dst, ReduceOp op,
                                          std::function<void()> finish) override {
    const int n = mpi_count(t);
    MPI_Comm comm = comm_;
    const bool is_dst = dst == rank_;
    return run("reduce", std::move(finish), [t, n, dst, op, comm, is_dst] {
      const void* send = is_dst ? MPI_IN_PLACE : t.data();
      detail::mpi_check(MPI_Reduce(send, is_dst ? t.data() : nullptr, n, mpi_type(t.dtype()), mpi_op(op, t.dtype()),
                                   dst, comm),
                        "MPI_Reduce");
    });
  }
  std::shared_ptr<FutureWork> gather_impl(const Tensor& gathered, const Tensor& input, int dst,
                                          std::function<void()> finish) override {
    const int n = mpi_count(input);
    if (gathered.defined()) mpi_count(gathered);
    MPI_Comm comm = comm_;
    return run("gather", std::move(finish), [gathered, input, n, dst, comm] {
      const MPI_Datatype type = mpi_type(input.dtype());
      void* out = gathered.defined() ? gathered.data() : nullptr;
      detail::mpi_check(MPI_Gather(input.data(), n, type, out, n, type, dst, comm), "MPI_Gather");
    });
  }
  std::shared_ptr<FutureWork> scatter_impl(const Tensor& output, const Tensor& stacked, int src,
                                           std::function<void()> finish) override {
    const int n = mpi_count(output);
    if (stacked.defined()) mpi_count(stacked);
    MPI_Comm comm = comm_;
    return run("scatter", std::move(finish), [output, stacked, n, src, comm] {
      const MPI_Datatype type = mpi_type(output.dtype());
      const void* in = stacked.defined() ? stacked.data() : nullptr;
      detail::mpi_check(MPI_Scatter(in, n, type, output.data(), n, type, src, comm), "MPI_Scatter");
    });
  }
  std::shared_ptr<FutureWork> alltoall_impl(const Tensor& output, const Tensor& input,
                                            std::function<void()> finish) override {
    const int n = mpi_count(input) / size_;
    MPI_Comm comm = comm_;
    return run("all_to_all", std::move(finish), [output, input, n, comm] {
      const MPI_Datatype type = mpi_type(input.dtype());
      detail::mpi_check(MPI_Alltoall(input.data(), n, type, output.data(), n, type, comm), "MPI_Alltoall");
    });
  }
  std::shared_ptr<FutureWork> alltoallv_impl(const Tensor& output, const Tensor& input,
                                             std::vector<int64_t> output_counts, std::vector<int64_t> input_counts,
                                             std::function<void()> finish) override {
    mpi_count(input);  // the displacements are ints too: the whole buffers must fit
    mpi_count(output);
    auto as_ints = [](const std::vector<int64_t>& counts, std::vector<int>& displacements) {
      std::vector<int> ints;
      for (int64_t c : counts) {
        displacements.push_back(ints.empty() ? 0 : displacements.back() + ints.back());
        ints.push_back(static_cast<int>(c));
      }
      return ints;
    };
    std::vector<int> send_displs, recv_displs;
    std::vector<int> send_counts = as_ints(input_counts, send_displs);
    std::vector<int> recv_counts = as_ints(output_counts, recv_displs);
    MPI_Comm comm = comm_;
    return run("all_to_all", std::move(finish), [=] {
      const MPI_Datatype type = mpi_type(input.dtype());
      detail::mpi_check(MPI_Alltoallv(input.data(), send_counts.data(), send_displs.data(), type, output.data(),
                                      recv_counts.data(), recv_displs.data(), type, comm),
                        "MPI_Alltoallv");
    });
  }
  std::shared_ptr<ProcessGroup> split_impl(int color, int key, std::vector<int> global_ranks) override {
    std::shared_ptr<ProcessGroup> group;
    detail::mpi_run_sync([&] {  // collective over this group: in order with its collectives
      MPI_Comm comm = MPI_COMM_NULL;
      detail::mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &comm), "MPI_Comm_split");
      if (comm != MPI_COMM_NULL) group = std::make_shared<MpiProcessGroup>(comm, std::move(global_ranks));
    });
    return group;
  }
  std::shared_ptr<FutureWork> barrier_impl() override {
    MPI_Comm comm = comm_;
    return run("barrier", {}, [comm] { detail::mpi_check(MPI_Barrier(comm), "MPI_Barrier"); });
  }
  std::shared_ptr<FutureWork> send_impl(const Tensor& t, int dst, int tag, std::function<void()> finish) override {
    const int n = mpi_count(t);
    std::lock_guard<std::mutex> lock(detail::mpi_mutex());
    MPI_Request request;
    detail::mpi_check(MPI_Isend(t.data(), n, mpi_type(t.dtype()), dst, tag, comm_, &request), "MPI_Isend");
    auto work = std::make_shared<RequestWork>(request, false, t, std::move(finish));
    watch(*work, "send");
    return work;
  }
  std::shared_ptr<FutureWork> recv_impl(const Tensor& t, int src, int tag, std::function<void()> finish) override {
    const int n = mpi_count(t);
    std::lock_guard<std::mutex> lock(detail::mpi_mutex());
    MPI_Request request;
    detail::mpi_check(MPI_Irecv(t.data(), n, mpi_type(t.dtype()), src, tag, comm_, &request), "MPI_Irecv");
    auto work = std::make_shared<RequestWork>(request, true, t, std::move(finish));
    watch(*work, "recv");
    return work;
  }

 private:
  // Queues `call` (a blocking MPI collective, which captures the tensors it uses, keeping them
  // alive) on the communication thread; its Work is done when the call has returned or raised,
  // or fails once the group's timeout has passed (Note [Collective timeouts] in mpi_runtime.cpp).
  std::shared_ptr<FutureWork> run(const char* op, std::function<void()> finish, std::function<void()> call) {
    auto work = std::make_shared<FutureWork>(std::move(finish));
    watch(*work, op);
    detail::mpi_run_collective(work, std::move(call));
    return work;
  }

  // Reads rank, size and the tag bound of comm_ (under the MPI lock).
  void adopt() {
    // errors come back as return codes, raised as strata::Error, instead of aborting the job
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
    max_tag_ = found && tag_ub ? *tag_ub : 32767;  // 32767: the least MPI guarantees
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<int> global_ranks_;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
};

}  // namespace

std::shared_ptr<ProcessGroup> new_mpi_group() { return std::make_shared<MpiProcessGroup>(); }

namespace detail {
bool mpi_available() { return true; }
}  // namespace detail

}  // namespace strata::dist
