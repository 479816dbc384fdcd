// Graph building: grad mode, saved tensors (with version checks and pack/unpack hooks),
// recording an op's node, and the leaf accumulator.
#include <algorithm>
#include <atomic>

#include <strata/autograd/graph.hpp>
#include <strata/autograd/function.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

#include "autograd/function_node.h"
#include "autograd/views.h"
#include "core/tensor_internal.h"

namespace strata::autograd {

namespace {

thread_local bool t_grad_enabled = true;

struct HookPair {
  std::function<std::any(const Tensor&)> pack;
  std::function<Tensor(const std::any&)> unpack;
};
thread_local std::vector<HookPair> t_saved_hooks;

std::atomic<uint64_t> g_next_sequence_nr{0};

AutogradMeta& meta_of(const Tensor& t) {
  TensorImpl& impl = t.impl();
  if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
  return *impl.autograd;
}

}  // namespace

bool is_grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

SavedTensorHooksGuard::SavedTensorHooksGuard(std::function<std::any(const Tensor&)> pack,
                                             std::function<Tensor(const std::any&)> unpack) {
  STRATA_CHECK(pack && unpack, "[saved_tensors_hooks] both pack and unpack must be given");
  t_saved_hooks.push_back({std::move(pack), std::move(unpack)});
}
SavedTensorHooksGuard::~SavedTensorHooksGuard() { t_saved_hooks.pop_back(); }

std::pair<std::function<std::any(const Tensor&)>, std::function<Tensor(const std::any&)>>
current_saved_tensor_hooks() {
  if (t_saved_hooks.empty()) return {};
  return {t_saved_hooks.back().pack, t_saved_hooks.back().unpack};
}

SavedTensor::SavedTensor(const Tensor& t, bool is_output) : defined_(t.defined()), is_output_(is_output) {
  if (!defined_) return;
  requires_grad_ = t.requires_grad();
  if (is_output_ && t.impl().autograd) output_nr_ = t.impl().autograd->output_nr;
  if (!t_saved_hooks.empty()) {
    // hooks see a plain tensor; what they return is all that is kept. The memory is watched,
    // not held (an offloading hook frees it): while it lives, what pack returned may be it
    // (an identity hook, a to() that had nothing to do), so an in-place write to it raises
    // at unpack as without hooks; once it is gone, no packed value can alias it.
    packed_ = t_saved_hooks.back().pack(is_output_ ? t.detach() : t);
    unpack_hook_ = t_saved_hooks.back().unpack;
    version_ = t.version();
    watched_ = t.storage();
    return;
  }
  version_ = t.version();
  version_source_ = t.storage();
  // An output keeps no link to its own node (that would be a cycle); unpack() restores it.
  data_ = is_output_ ? t.detach() : t;
}

Tensor SavedTensor::unpack(const std::shared_ptr<Node>& owner) const {
  if (!defined_) return Tensor();
  Tensor t;
  if (unpack_hook_) {
    if (std::shared_ptr<Storage> watched = watched_.lock())
      STRATA_CHECK(watched->version() == version_,
                   "[autograd] a tensor needed for the backward of {} was modified by an in-place operation after "
                   "a saved-tensor hook packed it: it is at version {}, expected version {}. Use an out-of-place "
                   "op, or clone() before modifying it.",
                   owner ? owner->name() : std::string("?"), watched->version(), version_);
    t = unpack_hook_(packed_);
    STRATA_CHECK(t.defined(), "[autograd] a saved-tensor unpack hook returned an undefined tensor");
  } else {
    STRATA_CHECK(version_source_ && version_source_->version() == version_,
                 "[autograd] a tensor needed for the backward of {} was modified by an in-place operation: it is at "
                 "version {}, expected version {}. Use an out-of-place op, or clone() before modifying it.",
                 owner ? owner->name() : std::string("?"), version_source_ ? version_source_->version() : -1,
                 version_);
    t = data_;
  }
  if (is_output_ && requires_grad_ && owner) {
    Tensor alias = t.detach();
    set_history(alias, owner, output_nr_);
    return alias;
  }
  return t;
}

void SavedTensor::reset() { *this = SavedTensor(); }

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

// Note [Iterative graph teardown]
// A graph is a chain of shared_ptr<Node>: letting each node's edges destroy the next node
// recurses once per op, and a 100,000-op chain overflows the stack (sooner under ASan). A
// dying node instead hands every input node it alone keeps alive to a thread-local list,
// and only the outermost destructor on the stack drains that list, one node at a time.
// Derived members (saved tensors, closures) are gone before this body runs, so a node kept
// alive both by an edge and by a saved tensor is seen here with one owner left.
Node::~Node() {
  thread_local std::vector<std::shared_ptr<Node>> t_orphans;
  thread_local bool t_draining = false;
  for (Edge& e : next_edges)
    if (e.node && e.node.use_count() == 1) t_orphans.push_back(std::move(e.node));
  if (t_draining) return;
  t_draining = true;
  while (!t_orphans.empty()) {
    std::shared_ptr<Node> n = std::move(t_orphans.back());
    t_orphans.pop_back();
    n.reset();  // its destructor appends its own orphans
  }
  t_draining = false;
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(leaf) {
  output_meta.push_back({leaf->shape, leaf->dtype, leaf->storage->device()});
  output_hooks.resize(1);
}

Tensor AccumulateGrad::run_hooks(Tensor g) const {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (!impl || !g.defined()) return g;
  Tensor leaf(impl);
  for (auto& hook : impl->autograd->hooks) {
    Tensor r = hook(g);
    if (!r.defined()) continue;
    STRATA_CHECK(r.shape() == leaf.shape() && r.dtype() == leaf.dtype() && r.device() == leaf.device(),
                 "[autograd] a gradient hook of a leaf of shape {} ({}, {}) returned a gradient of shape {} ({}, {})",
                 leaf.shape(), leaf.dtype(), leaf.device(), r.shape(), r.dtype(), r.device());
    g = r;
  }
  return g;
}

Grads AccumulateGrad::apply(Grads&& grads) {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (!impl || grads.empty() || !grads[0].defined()) return {};
  Tensor leaf(impl);
  AutogradMeta& meta = *impl->autograd;
  Tensor g = run_hooks(std::move(grads[0]));
  accumulate(meta, std::move(g));
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

void AccumulateGrad::accumulate(AutogradMeta& meta, Tensor g) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!meta.grad.defined()) {
    // The stored gradient is the user's to write into (accumulation, zero_grad, clipping): keep
    // the incoming tensor only when it is dense (not an expanded or strided view) and nothing
    // else can see it. create_graph records the copy.
    const bool keep = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && strata::detail::is_dense(g);
    if (is_grad_enabled()) meta.grad = keep ? g : g.clone();
    else meta.grad = keep ? g.detach() : g.detach().clone();
  } else if (is_grad_enabled() || !strata::detail::is_dense(meta.grad)) {
    meta.grad = meta.grad + g;  // create_graph: the sum is part of the recorded graph
  } else {
    meta.grad.add_(g);
  }
}

bool any_requires_grad(std::initializer_list<const Tensor*> ts) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& ts) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void check_once_differentiable(const char* op, const Grads& grad_outputs, const Saved& saved) {
  STRATA_CHECK(!any_requires_grad(grad_outputs) && !any_requires_grad(saved),
               "[{}] double backward is not supported: its backward is not differentiable, and create_graph "
               "asked for a gradient of it",
               op);
}

Edge gradient_edge(const Tensor& t) {
  detail::refresh_view(t);
  AutogradMeta& meta = meta_of(t);
  if (meta.grad_fn) return Edge{meta.grad_fn, meta.output_nr};
  // one accumulator per leaf, even when graphs are recorded on several threads at once
  static std::mutex accumulator_mutex;
  std::lock_guard<std::mutex> lock(accumulator_mutex);
  std::shared_ptr<AccumulateGrad> acc = meta.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.accumulator = acc;
  }
  return Edge{acc, 0};
}

void visit_leaves(const std::vector<Tensor>& roots, std::unordered_set<uint64_t>& visited,
                  const std::function<void(const TensorImpl*)>& on_leaf) {
  std::vector<std::shared_ptr<Node>> stack;
  for (const Tensor& root : roots)
    if (root.defined() && root.requires_grad()) stack.push_back(gradient_edge(root).node);
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (!node || !visited.insert(node->sequence_nr).second) continue;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(node.get())) {
      if (const std::shared_ptr<TensorImpl> leaf = acc->leaf()) on_leaf(leaf.get());
      continue;
    }
    for (const Edge& e : node->next_edges) stack.push_back(e.node);
  }
}

void set_history(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  AutogradMeta& meta = meta_of(t);
  meta.requires_grad = true;
  meta.grad_fn = node;
  meta.output_nr = output_nr;
}

// Only floating tensors carry gradients, as in PyTorch: an integer or bool result (a cast, an
// integer sum) is a constant, and a gradient through it would be wrong.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            const std::vector<Tensor>& saved, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  bool any_floating = false;
  for (const Tensor& out : outputs) any_floating = any_floating || (out.defined() && is_floating(out.dtype()));
  if (!any_floating) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  for (const Tensor& in : inputs) {
    bool needs = in.defined() && in.requires_grad();
    node->next_edges.push_back(needs ? gradient_edge(in) : Edge{});
    node->input_meta.push_back(in.defined() ? TensorMeta{in.shape(), in.dtype(), in.device()} : TensorMeta{});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->output_meta.push_back({out.shape(), out.dtype(), out.device()});
    if (is_floating(out.dtype())) set_history(out, node, static_cast<uint32_t>(i));
    bool is_input = false;  // an op may hand an input back
    for (const Tensor& in : inputs) is_input = is_input || out.is_same(in);
    if (!is_input) detail::mark_output(out, inputs);  // a view op marks its view after this
  }
  node->output_hooks.resize(outputs.size());
  for (const Tensor& s : saved) {
    bool is_output = false;
    for (const Tensor& out : outputs) is_output = is_output || (s.defined() && s.is_same(out));
    node->saved.emplace_back(s, is_output);
  }
}

}  // namespace strata::autograd

namespace strata::autograd::detail {
Tensor zeros_for_meta(const TensorMeta& m) { return zeros(m.shape, TensorOptions(m.dtype, m.device)); }
}  // namespace strata::autograd::detail
