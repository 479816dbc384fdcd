// ProcessGroup's public collectives: argument checks shared by every backend, the contiguous
// working copies a backend reduces in, and the step that writes results back into the caller's
// tensors when the Work is waited for. FutureWork and timeouts: timeouts.cpp.
//
// Note [Half reductions]: MPI has no float16 or bfloat16 type, and a sum rounded to half
// precision at every hop loses more the more ranks there are. A float16 or bfloat16 allreduce,
// reduce or reduce_scatter therefore reduces a float32 copy and rounds once, when it writes back (the
// result is the correctly rounded float32 reduction). Broadcast, gather and point-to-point
// traffic move the 2-byte values unchanged.
#include "dist/backends.h"
#include "dist/working_copy.h"

#include <strata/dist/process_group.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist {

using detail::is_half;
using detail::working_copy;
using detail::write_back;
using detail::finish_call;
using detail::group_or_default;

// ---- argument checks ---------------------------------------------------------------------

namespace {

constexpr const char* kDeviceNames[] = {"cpu", "cuda"};

}  // namespace

void ProcessGroup::check_tensor(const char* op, const Tensor& t) const {
  check_member(op);
  STRATA_CHECK(t.defined(), "[{}] the tensor is undefined", op);
  STRATA_CHECK(t.device().type == device_type(), "[{}] the {} backend works on {} tensors, got one on {}", op,
               backend(), kDeviceNames[static_cast<int>(device_type())], t.device());
}

void ProcessGroup::check_list(const char* op, const char* what, const std::vector<Tensor>& list,
                              const Tensor& like) const {
  STRATA_CHECK(static_cast<int>(list.size()) == size(), "[{}] {} {} tensors given for {} ranks", op, list.size(), what,
               size());
  for (size_t r = 0; r < list.size(); ++r) {
    check_tensor(op, list[r]);
    const Tensor& t = list[r];
    STRATA_CHECK(t.shape() == like.shape() && t.dtype() == like.dtype() && t.device() == like.device(),
                 "[{}] {} {} is {} {} on {}, expected {} {} on {}", op, what, r, t.shape(), t.dtype(), t.device(),
                 like.shape(), like.dtype(), like.device());
  }
}

void ProcessGroup::check_member(const char* op) const {
  if (is_member()) return check_usable(op);
  std::string ranks;
  for (int r : global_ranks()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  ::strata::detail::throw_error("[{}] this rank is not a member of the group of global ranks [{}]: new_group gave it a "
                                "handle for the group, which runs no operation here",
                                op, ranks);
}

void ProcessGroup::check_peer(const char* op, int peer, const char* what) const {
  STRATA_CHECK(peer >= 0 && peer < size(), "[{}] {} rank {} is out of range for a group of {} ranks", op, what, peer,
               size());
}

// ---- collectives -------------------------------------------------------------------------

std::shared_ptr<Work> ProcessGroup::allreduce(const Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  STRATA_CHECK(op != ReduceOp::Avg || is_floating(tensor.dtype()),
               "[all_reduce] ReduceOp::Avg needs a floating dtype, got {}", tensor.dtype());
  const DType wdt = is_half(tensor.dtype()) ? kFloat32 : tensor.dtype();
  Tensor work = working_copy(tensor, wdt, true);
  const int n = size();
  auto finish = [tensor, work, op, n] {
    if (op == ReduceOp::Avg) work.div_(n);
    write_back(tensor, work);
  };
  return allreduce_impl(work, op == ReduceOp::Avg ? ReduceOp::Sum : op, finish);
}

std::shared_ptr<Work> ProcessGroup::broadcast(const Tensor& tensor, int root) {
  check_tensor("broadcast", tensor);
  check_peer("broadcast", root, "root");
  Tensor work = working_copy(tensor, tensor.dtype(), true);
  return broadcast_impl(work, root, [tensor, work] { write_back(tensor, work); });
}

std::shared_ptr<Work> ProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  check_tensor("all_gather", input);
  check_list("all_gather", "output", outputs, input);
  const int64_t n = input.numel();
  Tensor in = working_copy(input, input.dtype(), true);
  Tensor gathered = empty({n * size()}, input.options());
  auto finish = [outputs, gathered] { detail::write_back_chunks(outputs, gathered); };
  return allgather_impl(gathered, in, finish);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                                   ReduceOp op) {
  check_tensor("reduce_scatter", output);
  STRATA_CHECK(op != ReduceOp::Avg || is_floating(output.dtype()),
               "[reduce_scatter] ReduceOp::Avg needs a floating dtype, got {}", output.dtype());
  check_list("reduce_scatter", "input", inputs, output);
  const DType wdt = is_half(output.dtype()) ? kFloat32 : output.dtype();
  Tensor stacked = detail::stack_flat(inputs, wdt);
  Tensor work = working_copy(output, wdt, false);
  const int ranks = size();
  auto finish = [output, work, op, ranks] {
    if (op == ReduceOp::Avg) work.div_(ranks);
    write_back(output, work);
  };
  return reduce_scatter_impl(work, stacked, op == ReduceOp::Avg ? ReduceOp::Sum : op, finish);
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  check_member("barrier");
  return barrier_impl();
}

std::shared_ptr<Work> ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  check_tensor("send", tensor);
  check_peer("send", dst, "destination");
  STRATA_CHECK(dst != rank(), "[send] rank {} cannot send to itself", dst);
  STRATA_CHECK(tag >= 0 && tag <= max_tag(), "[send] tag {} is outside [0, {}]", tag, max_tag());
  return send_impl(working_copy(tensor, tensor.dtype(), true), dst, tag, {});
}

std::shared_ptr<Work> ProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  check_tensor("recv", tensor);
  check_peer("recv", src, "source");
  STRATA_CHECK(src != rank(), "[recv] rank {} cannot receive from itself", src);
  STRATA_CHECK(tag >= 0 && tag <= max_tag(), "[recv] tag {} is outside [0, {}]", tag, max_tag());
  Tensor work = working_copy(tensor, tensor.dtype(), false);
  return recv_impl(work, src, tag, [tensor, work] { write_back(tensor, work); });
}

// ---- the default group and torch.distributed's functions ----------------------------------

namespace {

std::mutex g_default_mutex;
std::shared_ptr<ProcessGroup> g_default;

}  // namespace

void init_process_group(const std::string& backend, std::optional<std::chrono::milliseconds> timeout) {
  STRATA_CHECK(backend == "mpi" || backend == "nccl",
               "[init_process_group] unknown backend '{}': expected 'mpi' or 'nccl'", backend);
  std::lock_guard<std::mutex> lock(g_default_mutex);
  STRATA_CHECK(!g_default, "[init_process_group] the default process group exists already ({})",
               g_default->backend());
  STRATA_CHECK(!timeout || timeout->count() > 0, "[init_process_group] the timeout must be positive, got {} ms",
               timeout ? timeout->count() : 0);
  auto group = backend == "mpi" ? new_mpi_group() : detail::nccl_default_group();
  if (timeout) group->set_timeout(*timeout);
  g_default = std::move(group);
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default.reset();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  return g_default != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  STRATA_CHECK(g_default, "[dist] no default process group: call dist::init_process_group first");
  return g_default;
}

bool is_available(const std::string& backend) {
  if (backend == "mpi") return detail::mpi_available();
  if (backend == "nccl") return detail::nccl_available();
  return false;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }

std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, std::shared_ptr<ProcessGroup> group,
                                 bool async_op) {
  return finish_call(group_or_default(group)->allreduce(tensor, op), async_op);
}

std::shared_ptr<Work> broadcast(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->broadcast(tensor, src), async_op);
}

std::shared_ptr<Work> all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                                 std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->allgather(tensor_list, tensor), async_op);
}

std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                                     std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->reduce_scatter(output, input_list, op), async_op);
}

void barrier(std::shared_ptr<ProcessGroup> group) { group_or_default(group)->barrier()->wait(); }

void send(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group, int tag) {
  group_or_default(group)->send(tensor, dst, tag)->wait();
}

void recv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group, int tag) {
  group_or_default(group)->recv(tensor, src, tag)->wait();
}

std::shared_ptr<Work> isend(const Tensor& tensor, int dst, std::shared_ptr<ProcessGroup> group, int tag) {
  return group_or_default(group)->send(tensor, dst, tag);
}

std::shared_ptr<Work> irecv(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group, int tag) {
  return group_or_default(group)->recv(tensor, src, tag);
}

}  // namespace strata::dist
