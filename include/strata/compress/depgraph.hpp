// Structured pruning with traced dependency groups (DepGraph, Fang et al. 2023): one forward of
// the model on an example input, with autograd on, is walked from its output (and every module
// call's result) back to the input, and the layers whose channels must be removed together are
// grouped: a producer's output channels with the norms, activations, residual adds,
// concatenations, splits and permutes they flow through, the depthwise or grouped convolutions
// that keep them apart, and the input channels (or the flattened feature blocks) of every layer
// that reads them; attention heads and recurrent hidden units are units of their own.
//
//   compress::DependencyGraph graph(model, example_input, {.protected_layers = {&model.fc}});
//   std::cout << graph.report();                  // every group, prunable or why not
//   graph.prune(0.3);                             // 30% of every prunable group, by L1
//   optim::AdamW opt(model.parameters(), ...);    // make optimizers after pruning
//
// What the tracer does not understand (an op it does not know, a tensor it cannot follow, a
// layer called outside its module) makes the affected groups unprunable with the reason; it
// never guesses. See docs/compress.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <strata/compress/prune.hpp>
#include <strata/nn/module.hpp>

namespace strata::compress {

/// Which channels of a layer a group member holds.
enum class ChannelRole : uint8_t {
  Out,   // a convolution's output channels, a Linear's output features, an Embedding's features
  In,    // a convolution's input channels, a Linear's input features (a flatten gives blocks of them)
  Norm,  // a BatchNorm's, GroupNorm's or InstanceNorm's channels, a LayerNorm's features
  Head,  // a MultiheadAttention's heads (removed with compress::remove_heads)
  Key,   // a MultiheadAttention's key features with separate weights (kdim: k_proj_weight's columns)
  Value, // a MultiheadAttention's value features with separate weights (vdim: v_proj_weight's columns)
};

struct GroupMember {
  nn::Module* module = nullptr;
  std::string name;           // as in named_modules() ("" for the model itself)
  ChannelRole role = ChannelRole::Out;
  int64_t channels = 0;       // how many of the layer's channels (or features) along `role` are in the group
};

/// Layers whose channels go together. A group has `size` units, numbered 0..size-1; removing a
/// unit removes its channels from every member (a grouped Conv2d's unit is one of its groups,
/// with all its channels; a flattened channel is its block of a Linear's input features).
struct DependencyGroup {
  std::vector<GroupMember> members;
  int64_t size = 0;
  std::string unprunable_reason;  // empty when the group can be pruned
  bool prunable() const { return unprunable_reason.empty(); }
  STRATA_API std::string to_string() const;
};

struct DependencyOptions {
  /// Layers whose output channels are kept (a classifier's outputs are kept anyway, as the
  /// model's output); their input channels may still go with the groups that feed them.
  std::vector<nn::Module*> protected_layers;
};

struct GraphPruning {
  Importance importance = Importance::L1;  // summed over the weights of every member
  /// false: `ratio` of each prunable group; true: one ranking of the units of all prunable groups.
  bool global = false;
  int64_t min_units = 1;  // each group keeps at least this many units
  /// Per-group ratios (not global): the group holding the layer's output channels (for a
  /// MultiheadAttention, its heads) uses this one.
  std::map<nn::Module*, double> ratios;
};

class STRATA_API DependencyGraph {
 public:
  /// Traces `model` on `example_input` (one forward, in eval mode, with grad on; the model's
  /// training flags, parameters and buffers are left as they were). Raises when the output does
  /// not depend on the input or a layer's sizes do not match what the trace recorded.
  DependencyGraph(nn::Module& model, const Tensor& example_input, DependencyOptions options = {});
  ~DependencyGraph();
  DependencyGraph(DependencyGraph&&) noexcept;
  DependencyGraph& operator=(DependencyGraph&&) noexcept;

  const std::vector<DependencyGroup>& groups() const;
  /// Every group, one line each, and why the unprunable ones are.
  std::string report() const;
  /// The importance of each unit of group `g`: `kind` of its channels' weights summed over the
  /// members (Conv2d / Linear rows and columns, norm weights; Taylor needs gradients).
  std::vector<double> importance(size_t g, Importance kind = Importance::L1) const;
  /// The units each group keeps (ascending; every unit for an unprunable group) when `ratio`
  /// (a fraction or count of units, per group or global) is removed. Changes nothing.
  std::vector<std::vector<int64_t>> select(Amount ratio, const GraphPruning& how = {}) const;
  /// Removes the units of group `g` not in `keep` from every member, then traces again, so
  /// the groups describe the smaller model (unit numbers restart at 0). When the smaller model
  /// fails on the example input, the model and the groups are left as they were, and it raises.
  void prune_group(size_t g, const std::vector<int64_t>& keep);
  /// select, then removes the units every group does not keep, then traces again; returns
  /// what each of the groups (as they were before) kept.
  std::vector<std::vector<int64_t>> prune(Amount ratio, const GraphPruning& how = {});

  struct Traced;  // the trace's units and groups (src/compress/depgraph_internal.h)

 private:
  void retrace();
  /// Removes the units each group does not keep and traces again; when that raises (the smaller
  /// model fails its forward), puts every layer back as it was and raises.
  void remove_and_retrace(const std::vector<std::vector<int64_t>>& keep);
  nn::Module* model_;
  Tensor example_;
  DependencyOptions options_;
  std::unique_ptr<Traced> traced_;
};

}  // namespace strata::compress
