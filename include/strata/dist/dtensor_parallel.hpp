// Tensor parallelism on DTensors (torch.distributed.tensor.parallel): parallelize_module shards
// nn::Linear layers by a plan of ColwiseParallel / RowwiseParallel styles, and distribute_module
// lays out any module's parameters and wraps its inputs and outputs.
//
//   auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
//   nn::Sequential mlp(nn::Linear(512, 2048), nn::ReLU(), nn::Linear(2048, 512));
//   dist::parallelize_module(mlp, tp, {{"0", dist::ColwiseParallel{}}, {"2", dist::RowwiseParallel{}}});
//   Tensor y = mlp(x);   // x and y replicated; one all-reduce forward, one backward
//
// A parallelized Linear keeps its parameters as plain tensors holding this rank's shard (its
// weight's rows for Colwise, columns for Rowwise; torch.chunk's pieces, so sizes need not divide)
// and hands its forward to a form (Note [Linear forms]) that views them as DTensors. Its inputs
// and outputs are plain local tensors laid out as the style's input_layouts and output_layouts
// (torch's use_local_output=True). Collective: every rank of the mesh makes the same calls.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <variant>

#include <strata/dist/dtensor.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

/// The weight split by output features (rows, Shard(0)), the bias with it; the input made
/// Replicate, the output Shard(-1) unless output_layouts says otherwise.
struct ColwiseParallel {
  Placement input_layouts = Replicate();
  Placement output_layouts = Shard(-1);
};

/// The weight split by input features (columns, Shard(1)), the bias replicated and added once
/// after the partial products are reduced; the input made Shard(-1), the output Replicate unless
/// output_layouts says otherwise (Shard(0): sequence parallel, the rows scattered).
struct RowwiseParallel {
  Placement input_layouts = Shard(-1);
  Placement output_layouts = Replicate();
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel>;

/// Applies each style of `plan` to the submodules its key names: a dotted path as get_submodule
/// takes ("" for `module` itself), where a "*" part matches any one name ("layers.*.fc1").
/// `mesh` is 1-D (slice a larger one: mesh["tp"]). The weights are the ones each layer holds on
/// the mesh's first rank, scattered. Raises, before changing any layer, for a key that matches
/// nothing, a match that is not a Linear, a layer that already has a form or that two keys match.
STRATA_API nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                                         const std::map<std::string, ParallelStyle>& plan);
/// `module` itself parallelized with `style`.
STRATA_API nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style);

/// (name, submodule, mesh): lays out the submodule's parameters (replacing their data in place).
using PartitionFn = std::function<void(const std::string& name, nn::Module& module, const DeviceMesh& mesh)>;
/// (module, input or output, mesh) -> the tensor the module (or its caller) gets instead.
using InputFn = std::function<Tensor(nn::Module& module, const Tensor& input, const DeviceMesh& mesh)>;
using OutputFn = std::function<Tensor(nn::Module& module, const Tensor& output, const DeviceMesh& mesh)>;

/// torch's distribute_module: `partition_fn` is called on `module` and every submodule below it,
/// pre-order; without one, every parameter and buffer is replicated (the mesh's first rank's
/// values broadcast). `input_fn` and `output_fn` become a forward pre-hook and a forward hook.
STRATA_API nn::Module& distribute_module(nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn = {},
                                         InputFn input_fn = {}, OutputFn output_fn = {});

}  // namespace strata::dist
