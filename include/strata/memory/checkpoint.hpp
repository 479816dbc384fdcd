// Activation checkpointing (torch.utils.checkpoint, non-reentrant): a checkpointed function
// keeps only its inputs in the forward and runs again in the backward to get back the
// tensors its ops saved, trading compute for memory.
//
//   Tensor h = memory::checkpoint([&](const Tensor& x) { return block(x); }, x);
//   Tensor y = memory::checkpoint_sequential(model, /*segments=*/4, x);
//
// The forward records the graph as usual, so gradients reach the inputs and every tensor the
// function closes over (a module's weights) exactly as without checkpointing, through
// Tensor::backward and autograd::grad alike; only the tensors saved for backward are dropped
// (Note [Checkpoint by saved-tensor hooks] in src/memory/checkpoint.cpp).
#pragma once

#include <functional>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>

namespace strata::nn {
class Module;
class Sequential;
}  // namespace strata::nn

namespace strata::memory {

struct CheckpointOptions {
  /// Runs the recomputation from the random state the forward started from (the default
  /// generator's and those in `generators`), so dropout draws the same masks; each generator
  /// is put back where it was afterwards.
  bool preserve_rng_state = true;
  /// Generators used inside the function besides the default one.
  std::vector<Generator*> generators;
};

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// Runs `fn(inputs)` without keeping the tensors its ops save for backward; the backward runs
/// fn again, with the grad mode, autocast state and (by default) random state of the forward,
/// on the same inputs. fn must run the same ops both times. An input modified in place between
/// the forward and the backward raises strata::Error, as does double backward (create_graph)
/// through the checkpoint, which is not supported. When grad mode is off it only calls fn.
/// fn is kept with the graph and called again in the backward, so what it captures by reference
/// must outlive the backward. A checkpoint nested in fn keeps its own inputs alive.
STRATA_API std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                                          const CheckpointOptions& options = {});
/// The single-tensor form.
STRATA_API Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                             const CheckpointOptions& options = {});

/// Splits `modules` into `segments` consecutive runs of equal length (the last takes the
/// remainder) and checkpoints each but the last, as torch.utils.checkpoint_sequential.
/// 1 <= segments <= modules.size().
STRATA_API Tensor checkpoint_sequential(const std::vector<nn::Module*>& modules, int64_t segments,
                                        const Tensor& input, const CheckpointOptions& options = {});
STRATA_API Tensor checkpoint_sequential(nn::Sequential& sequential, int64_t segments, const Tensor& input,
                                        const CheckpointOptions& options = {});

}  // namespace strata::memory
