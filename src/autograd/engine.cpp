// The backward engine. It counts, for every node reachable from the roots, how many edges
// lead into it; a node runs once all of them have delivered their gradient, latest-created
// first among those ready. The walk is iterative, so graph depth is bounded only by memory.
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <strata/autograd/autograd.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

namespace strata::autograd {

namespace {

// Sums a gradient over the dims it was broadcast along, so it matches its input's shape.
Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  STRATA_CHECK(lead >= 0, "[autograd] gradient of shape {} cannot be reduced to the input shape {}", g.shape(), shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t gs = g.shape()[lead + static_cast<int64_t>(i)];
    STRATA_CHECK(gs == shape[i] || shape[i] == 1, "[autograd] gradient of shape {} does not match the input shape {}",
                 g.shape(), shape);
    if (shape[i] == 1 && gs != 1) dims.push_back(lead + static_cast<int64_t>(i));
  }
  Tensor r = dims.empty() ? g : g.sum(dims, /*keepdim=*/true);
  return r.view(shape);
}

Tensor reduce_to_input(Tensor g, const TensorMeta& m) {
  if (g.shape() != m.shape) g = sum_to(g, m.shape);
  if (g.dtype() != m.dtype) g = g.to(m.dtype);
  if (g.device() != m.device) g = g.to(m.device);
  return g;
}

// The callbacks queued (queue_callback) during the backward pass running on this thread; a
// nested backward (autograd::grad inside a hook) has its own.
thread_local std::vector<std::function<void()>>* t_final_callbacks = nullptr;

class FinalCallbacks {
 public:
  FinalCallbacks() : previous_(t_final_callbacks) { t_final_callbacks = &callbacks_; }
  ~FinalCallbacks() { t_final_callbacks = previous_; }
  void run() {
    for (size_t i = 0; i < callbacks_.size(); ++i) {  // by index: a callback may queue another
      std::function<void()> callback = std::move(callbacks_[i]);
      callback();
    }
    callbacks_.clear();
  }

 private:
  std::vector<std::function<void()>> callbacks_;
  std::vector<std::function<void()>>* previous_;
};

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

struct Capture {
  Node* node;
  uint32_t slot;
};

// Runs the graph from `roots`. With captures (autograd::grad), leaf accumulators do not run
// and the gradient arriving at each captured edge is returned instead.
std::vector<Tensor> execute(const std::vector<Edge>& roots, std::vector<Tensor> root_grads, bool retain_graph,
                            bool create_graph, const std::vector<Capture>* captures) {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::unordered_map<Node*, std::vector<Node*>> parents;  // filled only with captures
  {
    std::vector<Node*> stack;
    for (const Edge& r : roots)
      if (keep_alive.emplace(r.node.get(), r.node).second) stack.push_back(r.node.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.node) continue;
        ++dependencies[e.node.get()];
        if (captures) parents[e.node.get()].push_back(n);
        if (keep_alive.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
      }
    }
  }
  // autograd::grad runs only the nodes on a path to a captured input, as PyTorch does: the
  // others would waste work, fire their hooks, and raise errors (a backward that cannot be
  // recorded under create_graph) about gradients nobody asked for. A captured node itself
  // only hands over its gradient: its backward runs only when it leads to another capture
  // (its saved tensors stay for a later backward, and may since have been written in place).
  std::unordered_set<Node*> needed;  // the strict ancestors of the captured nodes
  if (captures) {
    std::vector<Node*> stack;
    for (const Capture& c : *captures) stack.push_back(c.node);
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (Node* p : parents[n])
        if (needed.insert(p).second) stack.push_back(p);
    }
  }

  std::unordered_map<Node*, Grads> buffers;
  auto deliver = [&](Node* n, uint32_t slot, Tensor g) {
    Grads& buf = buffers[n];
    if (buf.size() < std::max<size_t>(n->output_meta.size(), slot + 1)) buf.resize(std::max<size_t>(n->output_meta.size(), slot + 1));
    if (!g.defined()) return;
    buf[slot] = buf[slot].defined() ? buf[slot] + g : g;
  };
  for (size_t i = 0; i < roots.size(); ++i) deliver(roots[i].node.get(), roots[i].input_nr, std::move(root_grads[i]));

  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready;
  for (auto& [n, _] : keep_alive)
    if (dependencies[n] == 0) ready.push(n);

  std::vector<Tensor> captured(captures ? captures->size() : 0);
  std::unordered_set<Node*> capture_nodes;
  if (captures)
    for (const Capture& c : *captures) capture_nodes.insert(c.node);

  FinalCallbacks final_callbacks;
  EnableGradGuard grad_mode(create_graph);
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Grads in = std::move(buffers[n]);
    buffers.erase(n);
    auto skip = [&] {  // a node autograd::grad does not run: its inputs' dependencies still fall
      for (const Edge& e : n->next_edges)
        if (e.node && --dependencies[e.node.get()] == 0) ready.push(e.node.get());
    };
    const bool captured_here = captures && capture_nodes.count(n);
    if (captures && !captured_here && !needed.count(n)) {
      skip();
      continue;
    }
    in.resize(std::max(in.size(), n->output_meta.size()));
    for (size_t slot = 0; slot < in.size() && slot < n->output_hooks.size(); ++slot) {
      if (!in[slot].defined()) continue;
      for (auto& hook : n->output_hooks[slot]) {
        Tensor r = hook(in[slot]);
        if (!r.defined()) continue;
        const Tensor& g = in[slot];
        STRATA_CHECK(r.shape() == g.shape() && r.dtype() == g.dtype() && r.device() == g.device(),
                     "[autograd] a gradient hook of an output of {} was given a gradient of shape {} ({}, {}) and "
                     "returned one of shape {} ({}, {})",
                     n->name(), g.shape(), g.dtype(), g.device(), r.shape(), r.dtype(), r.device());
        in[slot] = r;
      }
    }
    auto* leaf_accumulator = dynamic_cast<AccumulateGrad*>(n);
    if (captured_here) {
      // a captured leaf's gradient goes through its hooks, as it would on its way to .grad
      if (leaf_accumulator && !in.empty()) in[0] = leaf_accumulator->run_hooks(std::move(in[0]));
      for (size_t i = 0; i < captures->size(); ++i)
        if ((*captures)[i].node == n && (*captures)[i].slot < in.size()) captured[i] = in[(*captures)[i].slot];
      if (!needed.count(n)) {
        skip();
        continue;
      }
    }
    const bool is_leaf_accumulator = leaf_accumulator != nullptr;
    Grads out;
    bool any_grad = false;
    for (const Tensor& g : in) any_grad = any_grad || g.defined();
    if (any_grad && !(captures && is_leaf_accumulator)) out = n->apply(std::move(in));
    if (!retain_graph) n->release_saved();
    STRATA_CHECK(out.empty() || out.size() == n->next_edges.size(),
                 "[autograd] backward of {} returned {} gradients for {} inputs", n->name(), out.size(),
                 n->next_edges.size());
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      Tensor g = i < out.size() && out[i].defined() ? reduce_to_input(std::move(out[i]), n->input_meta[i]) : Tensor();
      deliver(e.node.get(), e.input_nr, std::move(g));
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  final_callbacks.run();
  return captured;
}

std::vector<Tensor> root_gradients(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
                                   std::vector<Edge>& roots) {
  STRATA_CHECK(!outputs.empty(), "[backward] no outputs given");
  STRATA_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
               "[backward] {} gradients given for {} outputs", grad_outputs.size(), outputs.size());
  std::vector<Tensor> grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    STRATA_CHECK(out.defined(), "[backward] output {} is undefined", i);
    STRATA_CHECK(out.requires_grad(), "[backward] output {} does not require grad and has no grad_fn", i);
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      STRATA_CHECK(out.numel() == 1, "[backward] a gradient can be created implicitly only for one-element outputs; "
                   "output {} has shape {}", i, out.shape());
      g = ones_like(out);
    } else {
      STRATA_CHECK(g.shape() == out.shape(), "[backward] gradient of shape {} given for output {} of shape {}",
                   g.shape(), i, out.shape());
      if (g.dtype() != out.dtype()) g = g.to(out.dtype());  // the backward runs in the output's dtype
    }
    roots.push_back(gradient_edge(out));
    grads.push_back(g);
  }
  return grads;
}

}  // namespace

void queue_callback(std::function<void()> callback) {
  STRATA_CHECK(t_final_callbacks != nullptr, "[queue_callback] no backward pass is running on this thread");
  STRATA_CHECK(callback != nullptr, "[queue_callback] the callback is empty");
  t_final_callbacks->push_back(std::move(callback));
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
              bool create_graph) {
  std::vector<Edge> roots;
  std::vector<Tensor> grads = root_gradients(outputs, grad_outputs, roots);
  execute(roots, std::move(grads), retain_graph || create_graph, create_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph, bool create_graph,
                         bool allow_unused) {
  std::vector<Edge> roots;
  std::vector<Tensor> grads = root_gradients(outputs, grad_outputs, roots);
  std::vector<Capture> captures;
  std::vector<std::shared_ptr<Node>> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    STRATA_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "[grad] input {} does not require grad", i);
    Edge e = gradient_edge(inputs[i]);
    keep.push_back(e.node);
    captures.push_back({e.node.get(), e.input_nr});
  }
  std::vector<Tensor> result =
      execute(roots, std::move(grads), retain_graph.value_or(create_graph), create_graph, &captures);
  for (size_t i = 0; i < result.size(); ++i) {
    STRATA_CHECK(result[i].defined() || allow_unused,
                 "[grad] input {} was not used to compute the outputs; pass allow_unused=true", i);
    if (result[i].defined()) result[i] = reduce_to_input(result[i], {inputs[i].shape(), inputs[i].dtype(), inputs[i].device()});
  }
  return result;
}

}  // namespace strata::autograd
