// The autograd graph: nodes (backward functions), the edges between them, and the tensors a
// node saves for its backward. Ops record a node with record(); see Note [Recording an op].
//
// Note [Recording an op]: after computing its outputs, a differentiable op calls
//   autograd::record("mul", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
//     return Grads{g[0] * s[1], g[0] * s[0]};
//   });
// naming its inputs, outputs, the tensors its backward needs, and the backward itself, written
// with strata ops. The engine reduces each returned gradient to its input's shape (summing
// broadcast dims) and dtype, so backward formulas may return broadcast-shaped gradients.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/tensor.hpp>

namespace strata::autograd {

class Node;
using Grads = std::vector<Tensor>;
using Saved = std::vector<Tensor>;
using GradHook = std::function<Tensor(const Tensor&)>;          // may return a replacement
using PostAccumulateHook = std::function<void(const Tensor&)>;  // receives the leaf

/// Where a gradient goes: input slot `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

/// Shape, dtype and device of a tensor, without its data.
struct TensorMeta {
  Shape shape;
  DType dtype = kFloat32;
  Device device;
};

/// A tensor saved for backward. Detects in-place modification (version counter) and runs
/// the saved-tensor hooks that were active when it was saved.
class STRATA_API SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output);
  /// The saved tensor; raises Error if it was modified in place since it was saved.
  Tensor unpack(const std::shared_ptr<Node>& owner) const;
  void reset();
  bool defined() const { return defined_; }

 private:
  bool defined_ = false;
  bool is_output_ = false;
  bool requires_grad_ = false;
  uint32_t output_nr_ = 0;
  int64_t version_ = 0;
  std::shared_ptr<Storage> version_source_;
  std::weak_ptr<Storage> watched_;  // with hooks: the memory saved, checked while it lives
  Tensor data_;    // for inputs: the tensor itself; for outputs: a detached alias
  std::any packed_;  // what a pack hook returned, when one was active
  std::function<Tensor(const std::any&)> unpack_hook_;
};

/// A backward function. apply() maps the gradients of the node's outputs to the gradients of
/// its inputs (next_edges, in order); an undefined tensor means "no gradient".
class STRATA_API Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();  // iterative: see Note [Iterative graph teardown]
  virtual Grads apply(Grads&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  /// Frees what the node saved; called after it runs unless the graph is retained.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<TensorMeta> input_meta;   // shape/dtype of each input, to reduce gradients to
  std::vector<TensorMeta> output_meta;  // to make zero gradients for unused outputs
  std::vector<std::vector<GradHook>> output_hooks;  // per output: run on its gradient
  uint64_t sequence_nr;
  /// The dims the op was given, for tools that read the graph (compress::DependencyGraph):
  /// permute's order, transpose's pair, split's dim, softmax's dim; empty for other ops.
  std::vector<int64_t> dims;
};

/// The node that accumulates into a leaf's .grad; one per leaf, shared by every graph that
/// uses it, so backward passes on several threads may accumulate into one leaf at once (its
/// mutex orders them, as PyTorch's).
class STRATA_API AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  Grads apply(Grads&& grads) override;
  /// Runs the leaf's gradient hooks on `g` (apply does, and autograd::grad for a captured leaf).
  Tensor run_hooks(Tensor g) const;
  std::string name() const override { return "AccumulateGrad"; }
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  void accumulate(AutogradMeta& meta, Tensor g);  // adds g to .grad under mutex_
  std::weak_ptr<TensorImpl> leaf_;
  std::mutex mutex_;
};

/// Per-tensor autograd state, created when a tensor first takes part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<AccumulateGrad> accumulator;
  std::vector<GradHook> hooks;                    // leaves: run before accumulation
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  // An op's output that shares memory with an input but has a history of its own (a custom
  // Function returning its input or a view of it): an in-place op under autograd on it, or on
  // a view of it, is refused, as the input's history would miss the write, and using it after
  // a write to the input raises, as its history is of the old values.
  bool aliases_input = false;
};

/// True when grad mode is on and any defined tensor in `ts` requires grad.
STRATA_API bool any_requires_grad(std::initializer_list<const Tensor*> ts);
STRATA_API bool any_requires_grad(const std::vector<Tensor>& ts);

using BackwardFn = std::function<Grads(const Grads& grad_outputs, const Saved& saved)>;

/// For a backward that runs its kernels without recording them (PyTorch's
/// once_differentiable): under create_graph (grad mode on inside the backward), a gradient
/// that depends on an incoming gradient or saved tensor needing grad would silently lose that
/// dependence, so this raises strata::Error naming `op` instead.
STRATA_API void check_once_differentiable(const char* op, const Grads& grad_outputs, const Saved& saved);

/// Records a node for an op that produced `outputs` from `inputs` (see Note [Recording an
/// op]). Does nothing unless grad mode is on and some input requires grad. Outputs become
/// non-leaf tensors that require grad.
STRATA_API void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                       const std::vector<Tensor>& saved, BackwardFn backward);

/// The edge a gradient for `t` flows into: its grad_fn, or its leaf accumulator.
STRATA_API Edge gradient_edge(const Tensor& t);

/// Walks the graph behind `roots` down to its leaves, each node once, calling `on_leaf` with the
/// leaf tensor of every accumulator reached. Nodes whose sequence number `visited` holds are
/// skipped and the walked ones added, so walks from several roots can share one set.
STRATA_API void visit_leaves(const std::vector<Tensor>& roots, std::unordered_set<uint64_t>& visited,
                             const std::function<void(const TensorImpl*)>& on_leaf);

/// Makes `t` a non-leaf output `output_nr` of `node`.
STRATA_API void set_history(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr);

namespace detail {
/// For an op's output `out` (not one of `inputs` itself) that took a history of its own: it is
/// no view for autograd, and when it shares memory with an input it is marked aliases_input.
/// record() and Function::apply call it.
STRATA_API void mark_output(const Tensor& out, const std::vector<Tensor>& inputs);
}  // namespace detail

/// Runs an in-place op on `self` whose tensors take part in autograd (Note [In-place under
/// autograd] in src/autograd/inplace.cpp): `out_of_place(value)` computes the op's result as
/// a new, recorded tensor of self's shape from `value` (self, or a copy of it when
/// `reads_self`, for an op whose backward keeps its input); the result is written into self,
/// which takes over its history; on a view, its base takes a history that puts the result there
/// (Note [Views under autograd] in src/autograd/views.cpp). `op` names the op in errors. Raises
/// strata::Error when self (or the tensor it views) is a leaf that requires grad, when self is
/// an op's output sharing the op's input's memory (aliases_input), or when a tensor that does
/// not fill its memory densely would need a new history while another tensor shares it.
STRATA_API Tensor& record_inplace(Tensor& self, const char* op, bool reads_self,
                                  const std::function<Tensor(const Tensor& value)>& out_of_place);

/// Saved-tensor hooks: while a guard is alive, every tensor saved for backward on this thread
/// is passed through pack, and unpack runs when backward needs it back.
class STRATA_API SavedTensorHooksGuard {
 public:
  SavedTensorHooksGuard(std::function<std::any(const Tensor&)> pack, std::function<Tensor(const std::any&)> unpack);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;
};

/// The innermost saved-tensor hooks active on this thread (both empty when none), for hooks that
/// keep some tensors themselves and hand the others on to those around them.
STRATA_API std::pair<std::function<std::any(const Tensor&)>, std::function<Tensor(const std::any&)>>
current_saved_tensor_hooks();

}  // namespace strata::autograd
