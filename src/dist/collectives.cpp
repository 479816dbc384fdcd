// The rooted collectives (reduce, gather, scatter): argument checks shared by every backend and
// the working copies they run on (see process_group.cpp for the others and Note [Half
// reductions], alltoall.cpp for all-to-all).
#include <strata/dist/process_group.hpp>

#include "dist/working_copy.h"

namespace strata::dist {

using detail::is_half;
using detail::working_copy;
using detail::write_back;
using detail::finish_call;
using detail::group_or_default;

std::shared_ptr<Work> ProcessGroup::reduce(const Tensor& tensor, int dst, ReduceOp op) {
  check_tensor("reduce", tensor);
  check_peer("reduce", dst, "destination");
  STRATA_CHECK(op != ReduceOp::Avg || is_floating(tensor.dtype()),
               "[reduce] ReduceOp::Avg needs a floating dtype, got {}", tensor.dtype());
  const DType wdt = is_half(tensor.dtype()) ? kFloat32 : tensor.dtype();
  Tensor work = working_copy(tensor, wdt, true);
  const int n = size();
  const bool is_dst = dst == rank();
  auto finish = [tensor, work, op, n, is_dst] {
    if (!is_dst) return;  // MPI and NCCL leave a non-root's buffer alone; so does the copy
    if (op == ReduceOp::Avg) work.div_(n);
    write_back(tensor, work);
  };
  return reduce_impl(work, dst, op == ReduceOp::Avg ? ReduceOp::Sum : op, finish);
}

std::shared_ptr<Work> ProcessGroup::gather(const std::vector<Tensor>& outputs, const Tensor& input, int dst) {
  check_tensor("gather", input);
  check_peer("gather", dst, "destination");
  Tensor gathered;
  if (dst == rank()) {
    check_list("gather", "output", outputs, input);
    gathered = empty({input.numel() * size()}, input.options());
  } else {
    STRATA_CHECK(outputs.empty(), "[gather] the output list must be empty on rank {}, which is not the destination {}",
                 rank(), dst);
  }
  Tensor in = working_copy(input, input.dtype(), true);
  auto finish = [outputs, gathered] {
    if (gathered.defined()) detail::write_back_chunks(outputs, gathered);
  };
  return gather_impl(gathered, in, dst, finish);
}

std::shared_ptr<Work> ProcessGroup::scatter(const Tensor& output, const std::vector<Tensor>& inputs, int src) {
  check_tensor("scatter", output);
  check_peer("scatter", src, "source");
  Tensor stacked;
  if (src == rank()) {
    check_list("scatter", "input", inputs, output);
    stacked = detail::stack_flat(inputs, output.dtype());
  } else {
    STRATA_CHECK(inputs.empty(), "[scatter] the input list must be empty on rank {}, which is not the source {}",
                 rank(), src);
  }
  Tensor work = working_copy(output, output.dtype(), false);
  return scatter_impl(work, stacked, src, [output, work] { write_back(output, work); });
}

std::shared_ptr<Work> reduce(const Tensor& tensor, int dst, ReduceOp op, std::shared_ptr<ProcessGroup> group,
                             bool async_op) {
  return finish_call(group_or_default(group)->reduce(tensor, dst, op), async_op);
}

std::shared_ptr<Work> gather(const Tensor& tensor, const std::vector<Tensor>& gather_list, int dst,
                             std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->gather(gather_list, tensor, dst), async_op);
}

std::shared_ptr<Work> scatter(const Tensor& tensor, const std::vector<Tensor>& scatter_list, int src,
                              std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->scatter(tensor, scatter_list, src), async_op);
}

}  // namespace strata::dist
