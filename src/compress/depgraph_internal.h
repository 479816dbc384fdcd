// What the dependency-graph files share (include/strata/compress/depgraph.hpp).
//
// Note [Channel labels]: the trace gives every channel it meets a label. A layer's output
// channels, a norm's channels and a layer's input channels get labels of their own, which carry
// the layer's entry (module, role, index); an op that ties channels together (a residual add, a
// BatchNorm over them, a depthwise convolution, a consumer reading them) unites their labels.
// A united class of labels is one unit: its entries are removed together. Channels the trace
// cannot follow get labels carrying a reason, which makes their whole group unprunable. Units
// that share a (module, role) form a group.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <strata/autograd/graph.hpp>
#include <strata/compress/depgraph.hpp>
#include <strata/nn/recurrent.hpp>

namespace strata::compress::detail {

/// One channel of one layer: removed with its unit.
struct UnitEntry {
  nn::Module* module = nullptr;
  ChannelRole role = ChannelRole::Out;
  int64_t index = 0;
};

/// A tensor's channels as the trace follows them: labels along `dim`, or, when dim < 0, a
/// tensor the trace does not follow, and why.
struct Channels {
  int64_t dim = -1;
  std::vector<int64_t> labels;
  std::string reason;
  bool followed() const { return dim >= 0; }
};

/// The labels of one trace (Note [Channel labels]).
class Labels {
 public:
  /// `n` new labels; with a reason, channels the trace cannot follow.
  std::vector<int64_t> fresh(int64_t n, const std::string& reason = {});
  /// The labels of a layer's channels along `role`, made (with their entries) on first use, so
  /// a layer called twice ties both calls' channels.
  const std::vector<int64_t>& layer(nn::Module* module, ChannelRole role, int64_t n);
  void unite(int64_t a, int64_t b);
  void unite(const std::vector<int64_t>& a, const std::vector<int64_t>& b);  // pairwise, same length
  void mark(int64_t label, const std::string& reason);
  void mark(const std::vector<int64_t>& labels, const std::string& reason);
  int64_t find(int64_t label);
  const std::vector<UnitEntry>& entries(int64_t label) const { return entries_[static_cast<size_t>(label)]; }
  const std::vector<std::string>& reasons(int64_t label) const { return reasons_[static_cast<size_t>(label)]; }
  int64_t size() const { return static_cast<int64_t>(parent_.size()); }

 private:
  std::vector<int64_t> parent_;
  std::vector<std::vector<UnitEntry>> entries_;
  std::vector<std::vector<std::string>> reasons_;
  std::map<std::pair<nn::Module*, ChannelRole>, std::vector<int64_t>> layers_;
};

/// How the trace finds the layer behind an op's node: the modules whose call returned the
/// node's output (forward hooks), or the module owning the weight the node reads (a layer's
/// method called directly, as BatchNorm's forward_relu, runs no hooks).
struct TraceModules {
  std::map<const autograd::Node*, std::vector<nn::Module*>> by_node;
  std::map<const TensorImpl*, nn::Module*> by_weight;
  /// Every module call's result, held (so no node is freed and its address reused): a result
  /// the model does not return (an auxiliary head kept aside) still reads channels.
  std::vector<std::shared_ptr<autograd::Node>> results;
  /// The calls of layers followed as a whole (has_module_rule): their inputs and the node of
  /// their one output (Note [Layers followed whole]).
  struct Call {
    nn::Module* module = nullptr;
    std::vector<Tensor> inputs;
    std::shared_ptr<autograd::Node> output;
  };
  std::vector<Call> calls;
  /// Calls of such layers with several results (a recurrent layer's states, an attention's weights): not
  /// followed; their inputs' channels are kept (`output` is null).
  std::vector<Call> calls_with_states;
};

/// c's labels along dim (size n); channels the trace cannot follow there get labels with the
/// reason, and c's own labels, followed along another dim, are marked.
std::vector<int64_t> labels_at(Labels& labels, const Channels& c, int64_t dim, int64_t n, const std::string& op);

/// Ties a convolution's input channels `x` (in_channels of them) to its own and, for groups > 1,
/// each group's input and output channels into one unit; returns its output channels' labels.
std::vector<int64_t> tie_conv(Labels& labels, nn::Module* conv, int64_t in, int64_t out, int64_t groups,
                              const std::vector<int64_t>& x);

/// The nodes computing a call's output from its inputs (the output's node excluded), or none
/// when another tensor (not an input, not the layer's own parameter) feeds them.
std::optional<std::set<const autograd::Node*>> nodes_inside(const TraceModules::Call& call);
/// Whether the trace follows a call of `m` as a whole rather than op by op.
bool has_module_rule(const nn::Module* m);
/// The channels of the output of a call of `m` (has_module_rule) on inputs with these channels
/// and shapes; ties the layer's labels to them, or marks them with why it cannot.
Channels follow_module(Labels& labels, nn::Module* m, const std::vector<Channels>& inputs,
                       const std::vector<Shape>& shapes, const Shape& out);

/// The product of s[from..to) (1 when empty), and whether a and b agree on their first n dims.
int64_t product(const Shape& s, size_t from, size_t to);
bool same_prefix(const Shape& a, const Shape& b, size_t n);
/// Where the channel dim of `in` lands when a reduction gives `out` (the node records no dims):
/// the same dim for every set of reduced dims (kept as 1 or dropped) that gives `out`, or -1 when
/// one of them reduces the channels or puts them elsewhere (a sum over the 4 channels of
/// (N, 4, 4, W) has the shape of one over its 4 rows).
int64_t reduced_channel_dim(const Shape& in, const Shape& out, size_t channel_dim);

/// An op's node as its rule sees it (depgraph_ops.cpp): its inputs' channels, the shapes, and
/// the dims the op recorded (autograd::Node::dims).
struct OpCall {
  std::string op;
  std::vector<Channels> inputs;
  std::vector<Shape> in_shapes, out_shapes;
  std::vector<int64_t> dims;
};
/// Whether depgraph_ops.cpp has the rule for `op`: the ops that move, split, merge or contract the
/// channel dim (reshapes, permute, transpose, split, softmax, matmul, the fused attention).
bool has_layout_rule(const std::string& op);
/// The channels of each of the op's outputs; ties the labels the op ties, or marks the inputs'
/// channels with why the trace cannot follow them.
std::vector<Channels> follow_layout_op(Labels& labels, const OpCall& call);

/// Follows the channels from `input` (the traced leaf) through the graphs of `output` and of
/// every module call's result, and marks the output's channels as the model's and those of the
/// results nothing reads as results.
void follow_channels(Labels& labels, const TraceModules& modules, const Tensor& input, const Tensor& output);

}  // namespace strata::compress::detail

namespace strata::compress {

/// A trace's groups and, per group, its units' entries.
struct DependencyGraph::Traced {
  std::vector<DependencyGroup> groups;
  std::vector<std::vector<std::vector<detail::UnitEntry>>> units;  // [group][unit] -> entries
};

namespace detail {
/// The units (classes of labels with entries) grouped by shared (module, role), in the order of
/// `model`'s modules; a group is unprunable for its units' reasons, a protected layer's output
/// channels, or a member with a pruning mask.
std::unique_ptr<DependencyGraph::Traced> build_groups(Labels& labels, nn::Module& model,
                                                      const DependencyOptions& options);

// What pruning needs of each kind of layer (depgraph_layers.cpp).
/// Per-index scores of one member's channels (zeros where its weights have none of them).
std::vector<double> member_scores(const GroupMember& m, Importance kind);
/// How many channels the layer has along `role`; -1 for a layer the tracer does not prune.
int64_t layer_channels(const nn::Module* m, ChannelRole role);
/// Removes the given channels (per role) from the layer's parameters, buffers and sizes.
void shrink_layer(nn::Module* m, const std::map<ChannelRole, std::set<int64_t>>& roles);
/// The modules whose tensors shrink_layer changes (the layer, and attention's out_proj), and a
/// function that puts the layer's sizes back as they are now.
std::vector<nn::Module*> shrunk_modules(nn::Module& m);
std::function<void()> saved_sizes(nn::Module& m);

// Recurrent layers (depgraph_recurrent.cpp, Note [Recurrent units]).
/// The channels of a call's output; ties the input features and the hidden units.
Channels follow_recurrent(Labels& labels, nn::RNNBase& r, const std::vector<Channels>& inputs,
                          const std::vector<Shape>& shapes, const Shape& out);
std::vector<double> recurrent_scores(const nn::RNNBase& r, ChannelRole role, Importance kind);
void shrink_recurrent(nn::RNNBase& r, const std::map<ChannelRole, std::set<int64_t>>& roles);
}  // namespace detail

}  // namespace strata::compress
