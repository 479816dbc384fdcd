// Tensor parallelism (Megatron-LM's): a Linear layer's weight split across the ranks of a
// group, by output features (ColumnParallelLinear) or by input features (RowParallelLinear),
// and the four autograd mappings that move activations between the full and the split form.
// A Column layer followed by a Row layer (an MLP, attention's projections) needs one
// allreduce in the forward and one in the backward:
//
//   ColumnParallelLinear fc1(512, 2048, group, {.gather_output = false});
//   RowParallelLinear fc2(2048, 512, group, {.input_is_parallel = true});
//   Tensor y = fc2(gelu(fc1(x)));        // x and y replicated on every rank
//
// Every rank must call these in the same order (they run collectives).
#pragma once

#include <memory>

#include <strata/core/generator.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

// The mappings; `group` defaults to the default group. Each is differentiable.
/// Forward: identity; backward: allreduce (sum) of the gradient (Megatron's f).
STRATA_API Tensor copy_to_tensor_parallel_region(const Tensor& x, std::shared_ptr<ProcessGroup> group = nullptr);
/// Forward: allreduce (sum); backward: identity (Megatron's g).
STRATA_API Tensor reduce_from_tensor_parallel_region(const Tensor& x, std::shared_ptr<ProcessGroup> group = nullptr);
/// Forward: this rank's slice of the last dim (which must divide by the group size);
/// backward: allgather of the gradient along the last dim.
STRATA_API Tensor scatter_to_tensor_parallel_region(const Tensor& x, std::shared_ptr<ProcessGroup> group = nullptr);
/// Forward: allgather along the last dim, in rank order; backward: this rank's slice.
STRATA_API Tensor gather_from_tensor_parallel_region(const Tensor& x, std::shared_ptr<ProcessGroup> group = nullptr);

struct ColumnParallelOptions {
  bool bias = true;
  /// Gather the output shards into the full output (else each rank returns its out/size slice).
  bool gather_output = true;
  /// Draws the full weight as nn::Linear would; every rank must draw the same (same seed).
  Generator* generator = nullptr;
};

/// y = x W^T + b with W (out_features, in_features) split by rows: this rank holds rows
/// [rank * out/size, (rank + 1) * out/size) of W and b. out_features must divide by the size.
class STRATA_API ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<ProcessGroup> group = nullptr,
                       ColumnParallelOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ColumnParallelLinear"; }

  int64_t in_features, out_features;
  Tensor weight;  // (out_features / size, in_features)
  Tensor bias;    // (out_features / size)

 private:
  std::shared_ptr<ProcessGroup> group_;
  bool gather_output_;
};

struct RowParallelOptions {
  bool bias = true;
  /// The input is already split along its last dim (a ColumnParallelLinear's output without
  /// gather_output); else the layer takes this rank's slice of the full input.
  bool input_is_parallel = false;
  Generator* generator = nullptr;
};

/// y = x W^T + b with W split by columns: this rank holds columns [rank * in/size, ...) and
/// multiplies its slice of x; the partial products are summed over ranks, then b (replicated)
/// is added. in_features must divide by the size.
class STRATA_API RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<ProcessGroup> group = nullptr,
                    RowParallelOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "RowParallelLinear"; }

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features / size)
  Tensor bias;    // (out_features), the same on every rank

 private:
  std::shared_ptr<ProcessGroup> group_;
  bool input_is_parallel_;
};

}  // namespace strata::dist
