// All-to-all, even and uneven: argument checks shared by every backend, the flat working buffers
// they run on, and the agreement of the ranks' sizes. An uneven exchange cannot be checked by one
// rank alone (rank i's count for j must be j's count for i), and a backend given disagreeing
// counts truncates, leaves part of a buffer unwritten or hangs, so the counts of every rank are
// gathered first and compared on every rank alike: all raise, or none does.
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

void ProcessGroup::check_counts_agree(const char* op, const char* unit, const std::vector<int64_t>& output_counts,
                                      const std::vector<int64_t>& input_counts, Device device) {
  const int n = size();
  std::vector<int64_t> mine(input_counts);
  mine.insert(mine.end(), output_counts.begin(), output_counts.end());
  std::vector<Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(empty({2 * n}, TensorOptions(kInt64, device)));
  allgather(all, from_vector(mine).to(device))->wait();
  std::vector<Tensor> counts;  // rank r's: what it sends to each rank, then what it expects from each
  for (const Tensor& t : all) counts.push_back(t.cpu());
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const int64_t sent = counts[static_cast<size_t>(i)].data_ptr<int64_t>()[j];
      const int64_t expected = counts[static_cast<size_t>(j)].data_ptr<int64_t>()[n + i];
      STRATA_CHECK(sent == expected, "[{}] rank {} sends {} {} to rank {}, which expects {} from it: the ranks' sizes "
                   "disagree", op, i, sent, unit, j, expected);
    }
  }
}

std::shared_ptr<Work> ProcessGroup::alltoall(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  check_member("all_to_all");
  STRATA_CHECK(static_cast<int>(inputs.size()) == size(), "[all_to_all] {} input tensors given for {} ranks",
               inputs.size(), size());
  STRATA_CHECK(static_cast<int>(outputs.size()) == size(), "[all_to_all] {} output tensors given for {} ranks",
               outputs.size(), size());
  const Tensor& like = inputs.front();
  std::vector<int64_t> input_counts, output_counts;
  for (const auto* list : {&inputs, &outputs}) {
    for (size_t r = 0; r < list->size(); ++r) {
      const Tensor& t = (*list)[r];
      const char* what = list == &inputs ? "input" : "output";
      check_tensor("all_to_all", t);
      STRATA_CHECK(t.dtype() == like.dtype() && t.device() == like.device(), "[all_to_all] {} {} is {} on {}, "
                   "expected input 0's {} on {}", what, r, t.dtype(), t.device(), like.dtype(), like.device());
      (list == &inputs ? input_counts : output_counts).push_back(t.numel());
    }
  }
  check_counts_agree("all_to_all", "elements", output_counts, input_counts, like.device());
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
  check_tensor(op, input);
  check_tensor(op, output);
  STRATA_CHECK(output.dtype() == input.dtype() && output.device() == input.device(),
               "[{}] the output is {} on {}, the input {} on {}", op, output.dtype(), output.device(), input.dtype(),
               input.device());
  std::vector<int64_t> in_rows = split_sizes(op, "input", input_split_sizes, input, size());
  std::vector<int64_t> out_rows = split_sizes(op, "output", output_split_sizes, output, size());
  STRATA_CHECK(Shape(input.shape().begin() + 1, input.shape().end()) ==
                   Shape(output.shape().begin() + 1, output.shape().end()),
               "[{}] the output's shape {} and the input's {} differ beyond dim 0", op, output.shape(), input.shape());
  check_counts_agree(op, "rows", out_rows, in_rows, input.device());
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
