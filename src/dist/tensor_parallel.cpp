// Tensor parallelism: Megatron-LM's four mappings as custom autograd functions, and the
// column- and row-parallel Linear layers built from them.
#include <strata/dist/tensor_parallel.hpp>

#include <strata/autograd/function.hpp>
#include <strata/nn/linear.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/matmul.hpp>

namespace strata::dist {

namespace {

using autograd::AutogradContext;
using Group = std::shared_ptr<ProcessGroup>;

Group resolve(Group group) { return group ? group : default_group(); }

Tensor sum_over_ranks(const Tensor& x, const Group& g) {
  Tensor y = x.detach().clone();
  g->allreduce(y, ReduceOp::Sum)->wait();
  return y;
}

Tensor own_slice(const Tensor& x, const Group& g, const char* op) {
  const int64_t last = x.size(-1);
  STRATA_CHECK(last % g->size() == 0, "[{}] the last dim ({}) does not divide by the group size {}", op, last,
               g->size());
  const int64_t part = last / g->size();
  return x.detach().narrow(-1, g->rank() * part, part).contiguous();
}

Tensor gather_last_dim(const Tensor& x, const Group& g) {
  std::vector<Tensor> parts;
  for (int r = 0; r < g->size(); ++r) parts.push_back(empty(x.shape(), x.options()));
  g->allgather(parts, x.detach())->wait();
  return cat(parts, -1);
}

Group group_of(AutogradContext& ctx) { return std::any_cast<Group>(ctx.saved_data.at("group")); }

struct CopyToRegion : autograd::Function<CopyToRegion> {
  static Tensor forward(AutogradContext& ctx, const Tensor& x, Group g) {
    ctx.saved_data["group"] = g;
    return x.clone();
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    return {sum_over_ranks(grad[0], group_of(ctx))};
  }
};

struct ReduceFromRegion : autograd::Function<ReduceFromRegion> {
  static Tensor forward(AutogradContext&, const Tensor& x, Group g) { return sum_over_ranks(x, g); }
  static std::vector<Tensor> backward(AutogradContext&, const std::vector<Tensor>& grad) { return {grad[0]}; }
};

struct ScatterToRegion : autograd::Function<ScatterToRegion> {
  static Tensor forward(AutogradContext& ctx, const Tensor& x, Group g) {
    ctx.saved_data["group"] = g;
    return own_slice(x, g, "scatter_to_tensor_parallel_region");
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    return {gather_last_dim(grad[0].contiguous(), group_of(ctx))};
  }
};

struct GatherFromRegion : autograd::Function<GatherFromRegion> {
  static Tensor forward(AutogradContext& ctx, const Tensor& x, Group g) {
    ctx.saved_data["group"] = g;
    return gather_last_dim(x.contiguous(), g);
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    return {own_slice(grad[0], group_of(ctx), "gather_from_tensor_parallel_region")};
  }
};

// this rank's part of `n` features split over the group
int64_t part_of(int64_t n, const Group& g, const char* layer, const char* what) {
  STRATA_CHECK(n > 0 && n % g->size() == 0, "[{}] {} ({}) must be a positive multiple of the group size {}", layer,
               what, n, g->size());
  return n / g->size();
}

}  // namespace

Tensor copy_to_tensor_parallel_region(const Tensor& x, Group group) { return CopyToRegion::apply(x, resolve(group)); }
Tensor reduce_from_tensor_parallel_region(const Tensor& x, Group group) {
  return ReduceFromRegion::apply(x, resolve(group));
}
Tensor scatter_to_tensor_parallel_region(const Tensor& x, Group group) {
  return ScatterToRegion::apply(x, resolve(group));
}
Tensor gather_from_tensor_parallel_region(const Tensor& x, Group group) {
  return GatherFromRegion::apply(x, resolve(group));
}

// The full weight is drawn as nn::Linear draws it (Megatron's master-weight initialization), so
// the shards of all ranks together are the layer a single process would have built.
ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, Group group, ColumnParallelOptions options)
    : in_features(in), out_features(out), group_(resolve(std::move(group))), gather_output_(options.gather_output) {
  const int64_t part = part_of(out, group_, "ColumnParallelLinear", "out_features");
  nn::Linear full(in, out, {.bias = options.bias, .generator = options.generator});
  const int64_t start = group_->rank() * part;
  weight = register_parameter("weight", full.weight.detach().narrow(0, start, part).clone());
  if (options.bias) bias = register_parameter("bias", full.bias.detach().narrow(0, start, part).clone());
}

Tensor ColumnParallelLinear::forward(const Tensor& input) {
  Tensor y = linear(copy_to_tensor_parallel_region(input, group_), weight, bias);  // (*, out / size)
  return gather_output_ ? gather_from_tensor_parallel_region(y, group_) : y;
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, Group group, RowParallelOptions options)
    : in_features(in), out_features(out), group_(resolve(std::move(group))),
      input_is_parallel_(options.input_is_parallel) {
  const int64_t part = part_of(in, group_, "RowParallelLinear", "in_features");
  nn::Linear full(in, out, {.bias = options.bias, .generator = options.generator});
  weight = register_parameter("weight", full.weight.detach().narrow(1, group_->rank() * part, part).clone());
  if (options.bias) bias = register_parameter("bias", full.bias.detach().clone());
}

Tensor RowParallelLinear::forward(const Tensor& input) {
  Tensor x = input_is_parallel_ ? input : scatter_to_tensor_parallel_region(input, group_);  // (*, in / size)
  Tensor y = reduce_from_tensor_parallel_region(linear(x, weight), group_);
  return bias.defined() ? y + bias : y;
}

}  // namespace strata::dist
