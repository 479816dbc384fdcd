// Running backward: Tensor::backward() accumulates into the leaves' .grad;
// autograd::grad() returns the gradients of outputs with respect to chosen inputs.
#pragma once

#include <functional>
#include <vector>

#include <strata/autograd/graph.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/core/tensor.hpp>

namespace strata::autograd {

/// Computes the gradient of `outputs` (weighted by `grad_outputs`; ones for scalar outputs
/// when omitted) and accumulates it into every leaf that requires grad. The engine walks the
/// graph iteratively and frees each node's saved tensors once it has run, unless
/// retain_graph. With create_graph the backward pass is itself recorded (double backward).
STRATA_API void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
                         bool retain_graph = false, bool create_graph = false);

/// The gradients of `outputs` with respect to `inputs`, returned instead of accumulated
/// (torch.autograd.grad). An input the outputs do not depend on raises Error unless
/// allow_unused, in which case its gradient is undefined. retain_graph defaults to
/// create_graph.
STRATA_API std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& grad_outputs = {},
                                    std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                                    bool allow_unused = false);

/// Runs `callback` once the backward pass running on this thread has finished walking the
/// graph, before backward() (or grad()) returns; callbacks run in the order queued, and one may
/// queue another. For hooks that start work during the backward and must complete it at its end
/// (DDP's gradient reduction). PyTorch's Variable._execution_engine.queue_callback. Raises
/// outside a backward pass. A backward that raises drops its queued callbacks.
STRATA_API void queue_callback(std::function<void()> callback);

}  // namespace strata::autograd
