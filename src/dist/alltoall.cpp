// All-to-all, even and uneven: argument checks shared by every backend, the flat working buffers
// they run on, and the agreement of the ranks' sizes. An uneven exchange cannot be checked by one
// rank alone (rank i's count for j must be j's count for i), and a backend given disagreeing
// counts truncates, leaves part of a buffer unwritten or hangs, so the counts of every rank are
// gathered first and compared on every rank alike: all raise, or none does. A rank's own mistakes
// travel with its counts, so they raise on every rank too.
#include <algorithm>
#include <exception>
#include <numeric>

#include <strata/dist/process_group.hpp>

#include "dist/working_copy.h"

namespace strata::dist {

using detail::finish_call;
using detail::group_or_default;
using detail::working_copy;
using detail::write_back;

namespace {

// `sizes` (rows of dim 0 per rank) checked against `t`, or t's dim 0 cut into equal parts.
std::vector<int64_t> split_sizes(const char* op, const char* what, const std::vector<int64_t>& sizes, const Tensor& t,
                                 int ranks) {
  STRATA_CHECK(t.dim() >= 1, "[{}] the {} needs a dim 0 to split, its shape is {}", op, what, t.shape());
  if (sizes.empty()) {
    STRATA_CHECK(t.size(0) % ranks == 0, "[{}] the {}'s dim 0 of {} does not split into {} equal parts", op, what,
                 t.size(0), ranks);
    return std::vector<int64_t>(static_cast<size_t>(ranks), t.size(0) / ranks);
  }
  STRATA_CHECK(static_cast<int>(sizes.size()) == ranks, "[{}] {} {} split sizes given for {} ranks", op, sizes.size(),
               what, ranks);
  for (size_t r = 0; r < sizes.size(); ++r)
    STRATA_CHECK(sizes[r] >= 0, "[{}] the {} split size for rank {} is negative ({})", op, what, r, sizes[r]);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  STRATA_CHECK(total == t.size(0), "[{}] the {} split sizes sum to {}, the {}'s dim 0 is {}", op, what, total, what,
               t.size(0));
  return sizes;
}

}  // namespace

void ProcessGroup::check_counts_agree(const char* op, const char* unit, std::exception_ptr local_error,
                                      const std::vector<int64_t>& output_counts,
                                      const std::vector<int64_t>& input_counts, Device device) {
  const int n = size();
  // [failed, what it sends to each rank, what it expects from each]; counts unknown after an error
  std::vector<int64_t> mine(2 * static_cast<size_t>(n) + 1, 0);
  mine[0] = local_error ? 1 : 0;
  if (!local_error) {
    std::copy(input_counts.begin(), input_counts.end(), mine.begin() + 1);
    std::copy(output_counts.begin(), output_counts.end(), mine.begin() + 1 + n);
  }
  std::vector<Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(empty({2 * n + 1}, TensorOptions(kInt64, device)));
  allgather(all, from_vector(mine).to(device))->wait();
  if (local_error) std::rethrow_exception(local_error);
  std::vector<Tensor> counts;
  for (const Tensor& t : all) counts.push_back(t.cpu());
  auto at = [&](int rank, int64_t k) { return counts[static_cast<size_t>(rank)].data_ptr<int64_t>()[k]; };
  for (int i = 0; i < n; ++i)
    STRATA_CHECK(at(i, 0) == 0, "[{}] rank {} raised on its arguments (its error names them): nothing was exchanged",
                 op, i);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const int64_t sent = at(i, 1 + j), expected = at(j, 1 + n + i);
      STRATA_CHECK(sent == expected, "[{}] rank {} sends {} {} to rank {}, which expects {} from it: the ranks' sizes "
                   "disagree", op, i, sent, unit, j, expected);
    }
  }
}

std::shared_ptr<Work> ProcessGroup::alltoall(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  const char* op = "all_to_all";
  check_member(op);
  // what the agreement needs (a tensor of the backend's device) raises here alone; every later
  // mistake raises on every rank
  STRATA_CHECK(static_cast<int>(inputs.size()) == size(), "[{}] {} input tensors given for {} ranks", op,
               inputs.size(), size());
  const Tensor& like = inputs.front();
  check_tensor(op, like);
  std::vector<int64_t> input_counts, output_counts;
  std::exception_ptr error;
  try {
    STRATA_CHECK(static_cast<int>(outputs.size()) == size(), "[{}] {} output tensors given for {} ranks", op,
                 outputs.size(), size());
    for (const auto* list : {&inputs, &outputs}) {
      for (size_t r = 0; r < list->size(); ++r) {
        const Tensor& t = (*list)[r];
        const char* what = list == &inputs ? "input" : "output";
        check_tensor(op, t);
        STRATA_CHECK(t.dtype() == like.dtype() && t.device() == like.device(), "[{}] {} {} is {} on {}, expected "
                     "input 0's {} on {}", op, what, r, t.dtype(), t.device(), like.dtype(), like.device());
        (list == &inputs ? input_counts : output_counts).push_back(t.numel());
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  check_counts_agree(op, "elements", error, output_counts, input_counts, like.device());
  Tensor in = detail::stack_flat(inputs, like.dtype());
  const int64_t received = std::accumulate(output_counts.begin(), output_counts.end(), int64_t{0});
  Tensor out = empty({received}, like.options());
  return alltoallv_impl(out, in, std::move(output_counts), std::move(input_counts),
                        [outputs, out] { detail::write_back_chunks(outputs, out); });
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

std::shared_ptr<Work> ProcessGroup::alltoall_base(const Tensor& output, const Tensor& input,
                                                  const std::vector<int64_t>& output_split_sizes,
                                                  const std::vector<int64_t>& input_split_sizes) {
  const char* op = "all_to_all_single";
  check_tensor(op, input);  // the agreement runs on the input's device: raises here alone
  std::vector<int64_t> in_rows, out_rows;
  std::exception_ptr error;
  try {
    check_tensor(op, output);
    STRATA_CHECK(output.dtype() == input.dtype() && output.device() == input.device(),
                 "[{}] the output is {} on {}, the input {} on {}", op, output.dtype(), output.device(), input.dtype(),
                 input.device());
    in_rows = split_sizes(op, "input", input_split_sizes, input, size());
    out_rows = split_sizes(op, "output", output_split_sizes, output, size());
    STRATA_CHECK(Shape(input.shape().begin() + 1, input.shape().end()) ==
                     Shape(output.shape().begin() + 1, output.shape().end()),
                 "[{}] the output's shape {} and the input's {} differ beyond dim 0", op, output.shape(),
                 input.shape());
  } catch (...) {
    error = std::current_exception();
  }
  check_counts_agree(op, "rows", error, out_rows, in_rows, input.device());
  int64_t row = 1;  // elements per row
  for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
  for (auto* counts : {&in_rows, &out_rows})
    for (int64_t& c : *counts) c *= row;
  Tensor in = working_copy(input, input.dtype(), true);
  Tensor out = working_copy(output, output.dtype(), false);
  return alltoallv_impl(out, in, std::move(out_rows), std::move(in_rows), [output, out] { write_back(output, out); });
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

std::shared_ptr<Work> all_to_all_single(const Tensor& output, const Tensor& input,
                                        const std::vector<int64_t>& output_split_sizes,
                                        const std::vector<int64_t>& input_split_sizes,
                                        std::shared_ptr<ProcessGroup> group, bool async_op) {
  return finish_call(group_or_default(group)->alltoall_base(output, input, output_split_sizes, input_split_sizes),
                     async_op);
}

}  // namespace strata::dist
