// The rooted collectives (reduce, gather, scatter) and all-to-all: argument checks shared by
// every backend and the working copies they run on (see process_group.cpp for the others and
// Note [Half reductions]).
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

std::shared_ptr<Work> ProcessGroup::alltoall(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  STRATA_CHECK(!inputs.empty(), "[all_to_all] {} input tensors given for {} ranks", inputs.size(), size());
  check_list("all_to_all", "input", inputs, inputs.front());
  check_list("all_to_all", "output", outputs, inputs.front());
  Tensor in = detail::stack_flat(inputs, inputs.front().dtype());
  Tensor out = empty(in.shape(), in.options());
  return alltoall_impl(out, in, [outputs, out] { detail::write_back_chunks(outputs, out); });
}

std::shared_ptr<Work> ProcessGroup::alltoall_base(const Tensor& output, const Tensor& input) {
  check_tensor("all_to_all_single", input);
  check_tensor("all_to_all_single", output);
  STRATA_CHECK(input.dim() >= 1 && input.shape()[0] % size() == 0,
               "[all_to_all_single] the input's dim 0 must split into {} equal chunks, its shape is {}", size(),
               input.shape());
  STRATA_CHECK(output.shape() == input.shape() && output.dtype() == input.dtype() && output.device() == input.device(),
               "[all_to_all_single] the output is {} {} on {}, expected the input's {} {} on {}", output.shape(),
               output.dtype(), output.device(), input.shape(), input.dtype(), input.device());
  Tensor in = working_copy(input, input.dtype(), true);
  Tensor out = working_copy(output, output.dtype(), false);
  return alltoall_impl(out, in, [output, out] { write_back(output, out); });
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

std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& output_tensor_list,
                                 const std::vector<Tensor>& input_tensor_list, std::shared_ptr<ProcessGroup> group,
                                 bool async_op) {
  return finish_call(group_or_default(group)->alltoall(output_tensor_list, input_tensor_list), async_op);
}

std::shared_ptr<Work> all_to_all_single(const Tensor& output, const Tensor& input, std::shared_ptr<ProcessGroup> group,
                                        bool async_op) {
  return finish_call(group_or_default(group)->alltoall_base(output, input), async_op);
}

}  // namespace strata::dist
