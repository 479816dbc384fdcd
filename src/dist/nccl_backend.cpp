// The NCCL process group, for CUDA tensors: one communicator per group on one device, its
// ncclUniqueId made by rank 0 and broadcast over MPI. Each operation runs on the group's own
// stream after the work already queued on the caller's current stream (an event orders them),
// so it overlaps later kernels; wait() makes the caller's current stream wait for it, without
// blocking the host, as PyTorch's NCCL Work does (barrier() blocks the host). Every NCCL call
// is checked. Timeouts: a wait that blocks the host (barrier(), wait(timeout)) polls the event
// and ncclCommGetAsyncError up to its deadline and, past it, aborts the communicator
// (ncclCommAbort) and raises the group's timeout error (Note [Timed-out groups], timeouts.cpp).
#include <nccl.h>

#include <mutex>
#include <optional>

#include <strata/core/cuda.hpp>
#include <strata/ops/creation.hpp>

#include "dist/backends.h"
#include "dist/backoff.h"
#include "dist/mpi_runtime.h"

namespace strata::dist {

namespace {

void nccl_check(ncclResult_t result, const char* what) {
  STRATA_CHECK(result == ncclSuccess, "[dist] {} failed: {} ({})", what, ncclGetErrorString(result),
               ncclGetLastError(nullptr));
}

// bool travels as uint8: its sum and max are an or, its product and min an and
ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case kBool: case kUInt8: return ncclUint8;
    case kInt8: return ncclInt8;
    case kInt32: return ncclInt32;
    case kInt64: return ncclInt64;
    case kFloat16: return ncclFloat16;
    case kBFloat16: return ncclBfloat16;
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op, DType d) {
  const bool logical = d == kBool;
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: return logical ? ncclMax : ncclSum;
    case ReduceOp::Product: return logical ? ncclMin : ncclProd;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// A group's communicator, shared with its Works: a timed-out wait aborts it, and the group then
// must not destroy it.
class NcclComm {
 public:
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() {
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
  }
  ncclComm_t get() const { return comm_; }
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }
  // Raises NCCL's asynchronous error (a peer's failure, a network error), aborting the communicator.
  void check_async_error() {
    ncclResult_t error = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &error), "ncclCommGetAsyncError");
    if (error == ncclSuccess || error == ncclInProgress) return;
    abort();
    nccl_check(error, "a NCCL operation (asynchronous error; the communicator is aborted)");
  }

 private:
  std::mutex mutex_;
  ncclComm_t comm_;
  bool aborted_ = false;
};

class NcclWork final : public FutureWork {
 public:
  NcclWork(cuda::Event done, int device, bool blocking, std::shared_ptr<NcclComm> comm, std::function<void()> finish)
      : FutureWork(std::move(finish)), done_(std::move(done)), device_(device), blocking_(blocking),
        comm_(std::move(comm)) {}
  using FutureWork::wait;
  // As PyTorch's: the caller's stream waits, the host does not (so no host deadline applies).
  void wait() override {
    if (blocking_) FutureWork::wait();
    else wait_until(Clock::time_point::max(), std::chrono::milliseconds(0));
  }

 protected:
  bool backend_done() override { return done_.query(); }
  bool wait_backend(Clock::time_point deadline) override {
    if (deadline == Clock::time_point::max()) {
      if (blocking_) done_.synchronize();
      else cuda::Stream::current(device_).wait(done_);
      return true;
    }
    detail::Backoff backoff;
    while (!done_.query()) {
      comm_->check_async_error();
      if (Clock::now() >= deadline) {
        comm_->abort();  // the kernel waiting for the missing rank ends only so
        return false;
      }
      backoff.pause(deadline);
    }
    return true;
  }

 private:
  cuda::Event done_;
  int device_;
  bool blocking_;
  std::shared_ptr<NcclComm> comm_;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  explicit NcclProcessGroup(int device) : device_(device) {
    STRATA_CHECK(device >= 0 && device < cuda::device_count(), "[dist] CUDA device {} does not exist ({} found)",
                 device, cuda::device_count());
    ncclUniqueId id;
    detail::mpi_run_sync([&] {  // in order with the MPI collectives already queued
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
      if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      detail::mpi_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast of the ncclUniqueId");
    });
    cuda::DeviceGuard guard(device_);
    nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    handle_ = std::make_shared<NcclComm>(comm_);
    stream_ = cuda::Stream::create(device_);
    for (int r = 0; r < size_; ++r) global_ranks_.push_back(r);
  }
  // A group over `comm`, split from another group's communicator on the same device.
  NcclProcessGroup(int device, ncclComm_t comm, std::vector<int> global_ranks)
      : device_(device), comm_(comm), handle_(std::make_shared<NcclComm>(comm)),
        global_ranks_(std::move(global_ranks)) {
    nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
    cuda::DeviceGuard guard(device_);
    stream_ = cuda::Stream::create(device_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::vector<int> global_ranks() const override { return global_ranks_; }

 protected:
  DeviceType device_type() const override { return DeviceType::CUDA; }
  int max_tag() const override { return 0; }  // NCCL matches send and recv by order, not tag

  std::shared_ptr<FutureWork> allreduce_impl(const Tensor& t, ReduceOp op, std::function<void()> finish) override {
    return run("all_reduce", {t}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclAllReduce(t.data(), t.data(), t.numel(), nccl_type(t.dtype()), nccl_op(op, t.dtype()), comm_, s),
                 "ncclAllReduce");
    });
  }
  std::shared_ptr<FutureWork> broadcast_impl(const Tensor& t, int root, std::function<void()> finish) override {
    return run("broadcast", {t}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclBroadcast(t.data(), t.data(), t.numel(), nccl_type(t.dtype()), root, comm_, s), "ncclBroadcast");
    });
  }
  std::shared_ptr<FutureWork> allgather_impl(const Tensor& gathered, const Tensor& input,
                                             std::function<void()> finish) override {
    return run("all_gather", {gathered, input}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclAllGather(input.data(), gathered.data(), input.numel(), nccl_type(input.dtype()), comm_, s),
                 "ncclAllGather");
    });
  }
  std::shared_ptr<FutureWork> reduce_scatter_impl(const Tensor& output, const Tensor& stacked, ReduceOp op,
                                                  std::function<void()> finish) override {
    return run("reduce_scatter", {output, stacked}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclReduceScatter(stacked.data(), output.data(), output.numel(), nccl_type(output.dtype()),
                                   nccl_op(op, output.dtype()), comm_, s),
                 "ncclReduceScatter");
    });
  }
  std::shared_ptr<FutureWork> reduce_impl(const Tensor& t, int dst, ReduceOp op,
                                          std::function<void()> finish) override {
    return run("reduce", {t}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclReduce(t.data(), t.data(), t.numel(), nccl_type(t.dtype()), nccl_op(op, t.dtype()), dst, comm_, s),
                 "ncclReduce");
    });
  }
  // gather, scatter and all-to-all are grouped point-to-point calls, as PyTorch's NCCL backend
  // makes them (NCCL has no such collective); a rank's own chunk goes through a send to itself.
  std::shared_ptr<FutureWork> gather_impl(const Tensor& gathered, const Tensor& input, int dst,
                                          std::function<void()> finish) override {
    const Tensor& out = gathered.defined() ? gathered : input;
    return run("gather", {out, input}, std::move(finish), false, [&](cudaStream_t s) {
      grouped([&] {
        const size_t n = static_cast<size_t>(input.numel());
        nccl_check(ncclSend(input.data(), n, nccl_type(input.dtype()), dst, comm_, s), "ncclSend (gather)");
        if (rank_ != dst) return;
        for (int r = 0; r < size_; ++r)
          nccl_check(ncclRecv(chunk(gathered, r, n), n, nccl_type(input.dtype()), r, comm_, s), "ncclRecv (gather)");
      });
    });
  }
  std::shared_ptr<FutureWork> scatter_impl(const Tensor& output, const Tensor& stacked, int src,
                                           std::function<void()> finish) override {
    const Tensor& in = stacked.defined() ? stacked : output;
    return run("scatter", {output, in}, std::move(finish), false, [&](cudaStream_t s) {
      grouped([&] {
        const size_t n = static_cast<size_t>(output.numel());
        if (rank_ == src)
          for (int r = 0; r < size_; ++r)
            nccl_check(ncclSend(chunk(stacked, r, n), n, nccl_type(output.dtype()), r, comm_, s), "ncclSend (scatter)");
        nccl_check(ncclRecv(output.data(), n, nccl_type(output.dtype()), src, comm_, s), "ncclRecv (scatter)");
      });
    });
  }
  std::shared_ptr<FutureWork> alltoall_impl(const Tensor& output, const Tensor& input,
                                            std::function<void()> finish) override {
    return run("all_to_all", {output, input}, std::move(finish), false, [&](cudaStream_t s) {
      grouped([&] {
        const size_t n = static_cast<size_t>(input.numel() / size_);
        const ncclDataType_t type = nccl_type(input.dtype());
        for (int r = 0; r < size_; ++r) {
          nccl_check(ncclSend(chunk(input, r, n), n, type, r, comm_, s), "ncclSend (all_to_all)");
          nccl_check(ncclRecv(chunk(output, r, n), n, type, r, comm_, s), "ncclRecv (all_to_all)");
        }
      });
    });
  }
  std::shared_ptr<FutureWork> alltoallv_impl(const Tensor& output, const Tensor& input,
                                             std::vector<int64_t> output_counts, std::vector<int64_t> input_counts,
                                             std::function<void()> finish) override {
    return run("all_to_all", {output, input}, std::move(finish), false, [&](cudaStream_t s) {
      grouped([&] {  // PyTorch's NCCL alltoall_base with split sizes: a send and a receive per peer
        const ncclDataType_t type = nccl_type(input.dtype());
        const size_t itemsize = input.itemsize();
        char* in = static_cast<char*>(input.data());
        char* out = static_cast<char*>(output.data());
        for (int r = 0; r < size_; ++r) {
          const auto sent = static_cast<size_t>(input_counts[static_cast<size_t>(r)]);
          const auto received = static_cast<size_t>(output_counts[static_cast<size_t>(r)]);
          nccl_check(ncclSend(in, sent, type, r, comm_, s), "ncclSend (all_to_all, split sizes)");
          nccl_check(ncclRecv(out, received, type, r, comm_, s), "ncclRecv (all_to_all, split sizes)");
          in += sent * itemsize;
          out += received * itemsize;
        }
      });
    });
  }
  std::shared_ptr<ProcessGroup> split_impl(int color, int key, std::vector<int> global_ranks) override {
    ncclComm_t comm = nullptr;
    cuda::DeviceGuard guard(device_);
    nccl_check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, nullptr), "ncclCommSplit");
    if (!comm) return nullptr;
    return std::make_shared<NcclProcessGroup>(device_, comm, std::move(global_ranks));
  }
  std::shared_ptr<FutureWork> barrier_impl() override {
    Tensor one = ones({1}, TensorOptions(kFloat32, Device::cuda(device_)));
    return run("barrier", {one}, {}, true, [&](cudaStream_t s) {
      nccl_check(ncclAllReduce(one.data(), one.data(), 1, ncclFloat32, ncclSum, comm_, s), "ncclAllReduce (barrier)");
    });
  }
  std::shared_ptr<FutureWork> send_impl(const Tensor& t, int dst, int, std::function<void()> finish) override {
    return run("send", {t}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclSend(t.data(), t.numel(), nccl_type(t.dtype()), dst, comm_, s), "ncclSend");
    });
  }
  std::shared_ptr<FutureWork> recv_impl(const Tensor& t, int src, int, std::function<void()> finish) override {
    return run("recv", {t}, std::move(finish), false, [&](cudaStream_t s) {
      nccl_check(ncclRecv(t.data(), t.numel(), nccl_type(t.dtype()), src, comm_, s), "ncclRecv");
    });
  }

 private:
  // Orders `call` on the group's stream after the caller's current stream, and tells the
  // allocator the tensors are in use there until it finishes.
  template <class F>
  std::shared_ptr<FutureWork> run(const char* op, std::initializer_list<Tensor> tensors, std::function<void()> finish,
                                  bool blocking, F&& call) {
    for (const Tensor& t : tensors)
      STRATA_CHECK(t.device().index == device_, "[dist] this NCCL group is on cuda:{}, a tensor is on {}", device_,
                   t.device());
    cuda::DeviceGuard guard(device_);
    cuda::Event ready;
    ready.record(cuda::Stream::current(device_));
    stream_->wait(ready);
    call(static_cast<cudaStream_t>(stream_->handle()));
    for (const Tensor& t : tensors) cuda::record_stream(t, *stream_);
    cuda::Event done;
    done.record(*stream_);
    auto work = std::make_shared<NcclWork>(done, device_, blocking, handle_, std::move(finish));
    watch(*work, op);
    return work;
  }

  // Runs `calls` between ncclGroupStart and ncclGroupEnd, so the sends and receives progress together.
  template <class F>
  static void grouped(F&& calls) {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    try {
      calls();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  }
  // The address of chunk r (of n elements) of the flat tensor t.
  static void* chunk(const Tensor& t, int r, size_t n) {
    return static_cast<char*>(t.data()) + static_cast<size_t>(r) * n * t.itemsize();
  }

  int device_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<NcclComm> handle_;  // owns comm_
  std::vector<int> global_ranks_;
  std::optional<cuda::Stream> stream_;  // set once the device is known to exist
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(int device) { return std::make_shared<NcclProcessGroup>(device); }

namespace detail {
bool nccl_available() { return true; }
std::shared_ptr<ProcessGroup> nccl_default_group() {
  const int count = cuda::device_count();
  STRATA_CHECK(count > 0, "[init_process_group] the nccl backend needs a CUDA device, and none was found");
  const int device = mpi_local_rank() % count;
  cuda::set_device(device);  // the rank's device becomes current, as torch.cuda.set_device(local_rank)
  return new_nccl_group(device);
}
}  // namespace detail

}  // namespace strata::dist
