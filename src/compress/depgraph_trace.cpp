// The channel-following walk of the dependency graph (Note [Channel labels] in
// depgraph_internal.h): the autograd graph's nodes in forward order, each op's rule mapping its
// inputs' channel labels to its outputs' and uniting the labels it ties together. An op without
// a rule, or a rule's precondition that does not hold, marks the channels it touches with the
// reason, so their groups are not pruned. The ops that move, split or contract the channel dim
// (reshapes, permute, split, softmax, matmul) have their rules in depgraph_ops.cpp.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <map>
#include <set>

#include <fmt/format.h>

#include <strata/core/error.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/normalization.hpp>

#include "compress/depgraph_internal.h"

namespace strata::compress::detail {

using autograd::Node;

namespace {

// Ops applied element by element, with broadcasting: channel c of the output reads channel c of
// every input that has the channel dim (Note [Channel labels]).
const std::set<std::string> kElementwise = {
    "add",  "sub",   "mul",    "div",   "maximum", "minimum", "pow",        "where",      "neg",   "abs",
    "exp",  "log",   "sqrt",   "rsqrt", "sin",     "cos",     "tanh",       "sigmoid",    "relu",  "gelu",
    "gelu_tanh", "silu", "square", "reciprocal", "pow_scalar", "clamp", "leaky_relu", "erf", "log1p", "expm1",
    "dropout", "copy", "to", "clone", "contiguous", "log2", "log10", "exp2"};
// Ops that work within each channel (pools, reductions over other dims, padding of the
// positions, a squeeze-excitation's broadcast); reductions and expands may move the channel dim.
const std::set<std::string> kWithinChannel = {
    "avg_pool2d", "max_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool3d", "max_pool3d",
    "adaptive_avg_pool3d", "adaptive_max_pool3d", "mean", "sum", "amax", "amin", "pad", "expand"};
// pools by the number of trailing dims they pool over, which must all lie after the channel dim
const std::map<std::string, size_t> kPoolDims = {
    {"avg_pool2d", 2}, {"max_pool2d", 2}, {"adaptive_avg_pool2d", 2}, {"adaptive_max_pool2d", 2},
    {"avg_pool3d", 3}, {"max_pool3d", 3}, {"adaptive_avg_pool3d", 3}, {"adaptive_max_pool3d", 3}};
const std::set<std::string> kReductions = {"mean", "sum", "amax", "amin"};

class Walk {
 public:
  Walk(Labels& labels, const TraceModules& modules, const Tensor& input)
      : labels_(labels), modules_(modules), input_(input.impl_ptr().get()) {
    input_channels_.dim = input.dim() == 4 ? 1 : input.dim() - 1;  // NCHW images, else features last
    if (input.dim() > 0)
      input_channels_.labels = labels.fresh(input.size(input_channels_.dim), "the model's input channels");
  }

  // Visits every node reachable from the roots (the model's output first); marks the channels
  // of the results no visited node reads, but the model's output, which is returned.
  Channels run(const std::vector<Node*>& roots, uint32_t output_nr) {
    for (const TraceModules::Call& call : modules_.calls) take_whole(call);
    const std::vector<Node*> order = forward_order(roots);
    std::set<const Node*> read;
    for (Node* n : order) {
      visit(*n);
      for (const autograd::Edge& e : n->next_edges) read.insert(e.node.get());
    }
    for (const TraceModules::Call& call : modules_.calls_with_states)
      for (const Tensor& t : call.inputs)
        if (const Channels c = channels_of(t); c.followed())
          labels_.mark(c.labels, fmt::format("a call of {} returning several results (its states or attention "
                                             "weights), which the tracer does not follow", call.module->name()));
    for (Node* n : order)
      if (n != roots[0] && !read.count(n))
        for (uint32_t j = 0; j < n->output_meta.size(); ++j)
          if (const Channels c = state(n, j); c.followed())
            labels_.mark(c.labels, "a result the model computes but does not return");
    return state(roots[0], output_nr);
  }

 private:
  // Every node reachable from the roots, each after the nodes that produce its inputs.
  static std::vector<Node*> forward_order(const std::vector<Node*>& roots) {
    std::vector<Node*> order;
    std::set<Node*> seen;
    for (Node* root : roots) {
      if (!seen.insert(root).second) continue;
      std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
      while (!stack.empty()) {
        auto& [n, next] = stack.back();
        if (next < n->next_edges.size()) {
          Node* child = n->next_edges[next++].node.get();
          if (child != nullptr && seen.insert(child).second) stack.emplace_back(child, 0);
          continue;
        }
        order.push_back(n);
        stack.pop_back();
      }
    }
    return order;
  }

  Channels state(const Node* n, uint32_t nr) const {
    auto it = states_.find({n, nr});
    if (it != states_.end()) return it->second;
    return Channels{-1, {}, "a tensor outside the traced graph"};
  }

  // Input i of n: a followed tensor, the model's input, or a tensor the trace does not follow.
  Channels input(const Node& n, size_t i) const {
    const autograd::Edge& e = n.next_edges[i];
    if (!e.valid()) return Channels{-1, {}, "a tensor outside the traced graph (a constant, a buffer or a "
                                            "parameter used outside its layer)"};
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(e.node.get())) {
      if (acc->leaf().get() == input_) return input_channels_;
      return Channels{-1, {}, "a parameter used outside its layer"};
    }
    return state(e.node.get(), e.input_nr);
  }

  std::vector<int64_t> labels_at(const Channels& c, int64_t dim, int64_t n, const std::string& op) {
    return detail::labels_at(labels_, c, dim, n, op);
  }

  template <class M> M* module_of(const Node& n) const {
    if (auto it = modules_.by_node.find(&n); it != modules_.by_node.end())
      for (nn::Module* m : it->second)
        if (auto* typed = dynamic_cast<M*>(m)) return typed;
    // the weight is the op's second input
    auto* acc = n.next_edges.size() > 1 ? dynamic_cast<autograd::AccumulateGrad*>(n.next_edges[1].node.get()) : nullptr;
    if (acc == nullptr) return nullptr;
    auto it = modules_.by_weight.find(acc->leaf().get());
    return it == modules_.by_weight.end() ? nullptr : dynamic_cast<M*>(it->second);
  }

  // Whether the node reads the layer's own parameters (inputs 1, 2: weight, bias) rather than a
  // tensor computed from them or another layer's; a parameter that needs no grad cannot be told.
  static bool reads_own(const Node& n, std::initializer_list<Tensor> params) {
    size_t i = 1;
    for (const Tensor& p : params) {
      if (i >= n.next_edges.size()) break;
      const autograd::Edge& e = n.next_edges[i++];
      if (!e.valid()) continue;
      auto* acc = dynamic_cast<autograd::AccumulateGrad*>(e.node.get());
      if (acc == nullptr || !p.defined() || acc->leaf().get() != p.impl_ptr().get()) return false;
    }
    return true;
  }

  void unknown(const Node& n, const std::string& why) {
    for (size_t i = 0; i < n.next_edges.size(); ++i) {
      const Channels c = input(n, i);
      if (c.followed()) labels_.mark(c.labels, why);
    }
    for (uint32_t j = 0; j < n.output_meta.size(); ++j) states_[{&n, j}] = Channels{-1, {}, "the output of " + why};
  }

  void set(const Node& n, Channels c) { states_[{&n, 0}] = std::move(c); }
  const Shape& in_shape(const Node& n, size_t i) const { return n.input_meta[i].shape; }
  const Shape& out_shape(const Node& n) const { return n.output_meta[0].shape; }

  void visit(const Node& n) {
    if (dynamic_cast<const autograd::AccumulateGrad*>(&n) != nullptr || inside_calls_.count(&n)) return;
    const std::string op = n.name();
    if (auto it = calls_.find(&n); it != calls_.end()) return module_call(n, *it->second);
    if (has_layout_rule(op)) return layout_op(n);
    if (n.output_meta.size() != 1) return unknown(n, fmt::format("op '{}' with {} outputs", op, n.output_meta.size()));
    if (op == "conv2d") return conv(n);
    if (op == "linear") return linear(n);
    if (op == "batch_norm" || op == "batch_norm_relu") return batch_norm(n);
    if (op == "layer_norm" || op == "rms_norm") return norm_over_features(n);
    if (op == "cat") return cat(n);
    if (kElementwise.count(op)) return elementwise(n);
    if (kWithinChannel.count(op)) return within_channel(n);
    unknown(n, fmt::format("op '{}', which the dependency tracer does not know", op));
  }

  void conv(const Node& n) {
    auto* m = module_of<nn::Conv2d>(n);
    if (m == nullptr || !m->weight.defined())
      return unknown(n, m ? "a Conv2d whose weight a form replaced"
                          : "a conv2d called outside the model's nn::Conv2d layers");
    if (!reads_own(n, {m->weight, m->bias})) return unknown(n, "a Conv2d computing with weights not its own");
    const auto x = labels_at(input(n, 0), 1, m->in_channels, "a Conv2d");
    set(n, Channels{1, tie_conv(labels_, m, m->in_channels, m->out_channels, m->options.groups, x), {}});
  }

  void linear(const Node& n) {
    auto* m = module_of<nn::Linear>(n);
    if (m == nullptr || !m->weight.defined())
      return unknown(n, m ? "a Linear whose weight a form replaced"
                          : "a linear called outside the model's nn::Linear layers");
    if (!reads_own(n, {m->weight, m->bias})) return unknown(n, "a Linear computing with weights not its own");
    const int64_t last = static_cast<int64_t>(in_shape(n, 0).size()) - 1;
    labels_.unite(labels_at(input(n, 0), last, m->in_features, "a Linear"),
                  labels_.layer(m, ChannelRole::In, m->in_features));
    set(n, Channels{static_cast<int64_t>(out_shape(n).size()) - 1, labels_.layer(m, ChannelRole::Out,
                                                                                 m->out_features), {}});
  }

  void batch_norm(const Node& n) {
    auto* m = module_of<nn::BatchNormBase>(n);
    if (m == nullptr || !reads_own(n, {m->weight, m->bias}))
      return unknown(n, "a batch_norm called outside an nn::BatchNorm or with weights not its own");
    const int64_t c = m->num_features;
    const std::vector<int64_t> x = labels_at(input(n, 0), 1, c, "a BatchNorm");
    labels_.unite(x, labels_.layer(m, ChannelRole::Norm, c));
    // the fused residual (forward_relu) is added channel by channel
    if (n.input_meta.size() > 3 && !in_shape(n, 3).empty())
      labels_.unite(x, labels_at(input(n, 3), 1, c, "a BatchNorm's residual add"));
    set(n, Channels{1, x, {}});
  }

  // A LayerNorm or RMSNorm: within each channel when it normalizes dims after the channels',
  // else over one dim of features, the channels, which its weight (and bias) go with.
  void norm_over_features(const Node& n) {
    nn::Module* m = nullptr;
    const Shape* normalized = nullptr;
    if (auto* ln = module_of<nn::LayerNorm>(n); ln != nullptr && reads_own(n, {ln->weight, ln->bias}))
      m = ln, normalized = &ln->normalized_shape;
    else if (auto* rms = module_of<nn::RMSNorm>(n); rms != nullptr && reads_own(n, {rms->weight}))
      m = rms, normalized = &rms->normalized_shape;
    const std::string layer = n.name() == "layer_norm" ? "LayerNorm" : "RMSNorm";
    const std::string a_layer = (layer == "LayerNorm" ? "a " : "an ") + layer;
    if (m == nullptr || m->name() != layer)
      return unknown(n, fmt::format("a {} called outside an nn::{} or with weights not its own", n.name(), layer));
    const Channels x = input(n, 0);
    const int64_t rank = static_cast<int64_t>(in_shape(n, 0).size());
    const int64_t first_normalized = rank - static_cast<int64_t>(normalized->size());
    if (x.followed() && x.dim < first_normalized) return set(n, x);  // normalizes within each channel
    if (normalized->size() != 1)
      return unknown(n, fmt::format("{} over several dims, one of them the channels'", a_layer));
    const int64_t f = normalized->front();
    const std::vector<int64_t> labels = labels_at(x, rank - 1, f, a_layer);
    labels_.unite(labels, labels_.layer(m, ChannelRole::Norm, f));
    set(n, Channels{rank - 1, labels, {}});
  }

  // The dim every followed input's channels land on in the output (right-aligned broadcasting);
  // -1 when none has channels there, -2 when they disagree.
  int64_t common_dim(const Node& n, const Shape& out) {
    int64_t dim = -1;
    for (size_t i = 0; i < n.next_edges.size(); ++i) {
      const Channels c = input(n, i);
      const Shape& s = in_shape(n, i);
      if (!c.followed()) continue;
      const int64_t d = c.dim + static_cast<int64_t>(out.size() - s.size());
      if (s[static_cast<size_t>(c.dim)] == 1 && out[static_cast<size_t>(d)] != 1) continue;  // broadcast
      if (dim != -1 && d != dim) return -2;
      dim = d;
    }
    return dim;
  }

  void elementwise(const Node& n) {
    const Shape& out = out_shape(n);
    const int64_t dim = common_dim(n, out);
    if (dim == -2) return unknown(n, fmt::format("op '{}' combining channels along different dims", n.name()));
    if (dim == -1) {
      // a followed channel broadcast across the output's: only its own, single-channel group
      for (size_t i = 0; i < n.next_edges.size(); ++i)
        if (input(n, i).followed()) labels_.mark(input(n, i).labels, "broadcast by op '" + n.name() + "'");
      return set(n, Channels{-1, {}, "the output of op '" + n.name() + "' on tensors the trace does not follow"});
    }
    std::vector<int64_t> labels;
    for (size_t i = 0; i < n.next_edges.size(); ++i) {
      const Shape& s = in_shape(n, i);
      const int64_t d = dim - static_cast<int64_t>(out.size() - s.size());
      if (d < 0 || (s[static_cast<size_t>(d)] == 1 && out[static_cast<size_t>(dim)] != 1)) {  // broadcast: ties none
        const Channels c = input(n, i);
        if (c.followed()) labels_.mark(c.labels, "broadcast by op '" + n.name() + "'");
        continue;
      }
      const std::vector<int64_t> l = labels_at(input(n, i), d, s[static_cast<size_t>(d)], "op '" + n.name() + "'");
      if (labels.empty()) labels = l;
      else labels_.unite(labels, l);
    }
    set(n, Channels{dim, labels, {}});
  }

  void within_channel(const Node& n) {
    const Channels x = input(n, 0);
    if (!x.followed()) return set(n, x);
    const Shape &in = in_shape(n, 0), &out = out_shape(n);
    const auto d = static_cast<size_t>(x.dim);
    int64_t at = same_prefix(in, out, d + 1) ? x.dim : -1;  // where the channels land
    if (kReductions.count(n.name())) at = reduced_channel_dim(in, out, d);
    if (n.name() == "expand") {  // right-aligned; a single channel made many is not followed
      at = x.dim + static_cast<int64_t>(out.size() - in.size());
      if (out[static_cast<size_t>(at)] != in[d]) at = -1;
    }
    if (const auto pool = kPoolDims.find(n.name()); pool != kPoolDims.end() && d + pool->second >= in.size())
      at = -1;  // pooled with the positions
    if (at < 0)
      return unknown(n, fmt::format("op '{}' from {} to {}, which may change the channel dim {}", n.name(),
                                    fmt::join(in, "x"), fmt::join(out, "x"), d));
    set(n, Channels{at, x.labels, {}});
  }

  void cat(const Node& n) {
    const Shape& out = out_shape(n);
    for (const autograd::TensorMeta& m : n.input_meta)
      if (m.shape.size() != out.size()) return unknown(n, "a cat of tensors of another rank than its output");
    int64_t dim = -1;  // the dim the inputs are joined along
    for (size_t d = 0; d < out.size() && dim < 0; ++d) {
      int64_t total = 0;
      bool others_equal = true;
      for (size_t i = 0; i < n.input_meta.size(); ++i) {
        total += in_shape(n, i)[d];
        others_equal = others_equal && same_prefix(in_shape(n, i), out, d) &&
                       std::equal(out.begin() + static_cast<std::ptrdiff_t>(d) + 1, out.end(),
                                  in_shape(n, i).begin() + static_cast<std::ptrdiff_t>(d) + 1);
      }
      if (total == out[d] && others_equal) dim = static_cast<int64_t>(d);
    }
    const int64_t channel_dim = common_dim(n, out);
    if (dim < 0 || channel_dim == -2) return unknown(n, "a cat the tracer cannot place");
    if (channel_dim == dim || channel_dim == -1) {
      // joined along the channels: the output's channels are the inputs' one after another
      Channels joined{dim, {}, {}};
      for (size_t i = 0; i < n.next_edges.size(); ++i) {
        const auto l = labels_at(input(n, i), dim, in_shape(n, i)[static_cast<size_t>(dim)], "a cat");
        joined.labels.insert(joined.labels.end(), l.begin(), l.end());
      }
      return set(n, joined);
    }
    elementwise(n);  // joined along another dim: channel c of every input is channel c of the output
  }

  void layout_op(const Node& n) {
    OpCall call{n.name(), {}, {}, {}, n.dims};
    for (size_t i = 0; i < n.next_edges.size(); ++i) {
      call.inputs.push_back(input(n, i));
      call.in_shapes.push_back(in_shape(n, i));
    }
    for (const autograd::TensorMeta& m : n.output_meta) call.out_shapes.push_back(m.shape);
    const std::vector<Channels> out = follow_layout_op(labels_, call);
    for (uint32_t j = 0; j < out.size(); ++j) states_[{&n, j}] = out[j];
  }

  // A tensor's channels: a followed result, the model's input, or a tensor the trace does not follow.
  Channels channels_of(const Tensor& t) const {
    if (!t.defined()) return Channels{-1, {}, "an undefined tensor"};
    if (t.grad_fn()) return state(t.grad_fn().get(), t.impl().autograd->output_nr);
    if (t.impl_ptr().get() == input_) return input_channels_;
    return Channels{-1, {}, "a tensor outside the traced graph (a constant or a buffer)"};
  }

  // Note [Layers followed whole]: a call computed from its inputs and the layer's own
  // parameters alone is followed as a whole; the nodes inside it are skipped.
  void take_whole(const TraceModules::Call& call) {
    const auto inside = nodes_inside(call);
    if (!inside) return;
    calls_[call.output.get()] = &call;
    inside_calls_.insert(inside->begin(), inside->end());
  }

  void module_call(const Node& n, const TraceModules::Call& call) {
    std::vector<Channels> inputs;
    std::vector<Shape> shapes;
    for (const Tensor& t : call.inputs) {
      inputs.push_back(channels_of(t));
      shapes.push_back(t.defined() ? t.shape() : Shape{});
    }
    set(n, follow_module(labels_, call.module, inputs, shapes, out_shape(n)));
  }

  Labels& labels_;
  const TraceModules& modules_;
  const TensorImpl* input_;
  Channels input_channels_;
  std::map<const Node*, const TraceModules::Call*> calls_;
  std::set<const Node*> inside_calls_;
  std::map<std::pair<const Node*, uint32_t>, Channels> states_;
};

}  // namespace

std::vector<int64_t> labels_at(Labels& labels, const Channels& c, int64_t dim, int64_t n, const std::string& op) {
  if (c.followed() && c.dim == dim && static_cast<int64_t>(c.labels.size()) == n) return c.labels;
  if (!c.followed()) return labels.fresh(n, fmt::format("{} reads {}", op, c.reason));
  const std::string why = fmt::format("{} reads them along dim {}, not their channel dim {}", op, dim, c.dim);
  labels.mark(c.labels, why);
  return labels.fresh(n, why);
}

void follow_channels(Labels& labels, const TraceModules& modules, const Tensor& input, const Tensor& output) {
  STRATA_CHECK(output.grad_fn() != nullptr,
               "[DependencyGraph] the model's output does not depend on its input: there is nothing to trace");
  Walk walk(labels, modules, input);
  std::vector<Node*> roots{output.grad_fn().get()};
  for (const auto& result : modules.results) roots.push_back(result.get());
  const Channels out = walk.run(roots, output.impl().autograd->output_nr);
  if (out.followed()) labels.mark(out.labels, "the model's output");
}

}  // namespace strata::compress::detail
