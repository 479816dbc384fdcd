// The layers the dependency trace follows as a whole (Note [Layers followed whole]).
//
// Note [Layers followed whole]: Conv1d, Conv3d and the transposed convolutions run as views
// around a 2-d op or as a composition of ops, GroupNorm and InstanceNorm as reshapes around a
// normalization, attention as projections, reshapes and a softmax; an op-by-op walk cannot tell
// their channels apart. So each call of such a layer is recorded (its inputs and its output's
// node, by a forward hook), and when every tensor its output is computed from is one of those
// inputs or the layer's own parameters, the walk skips the nodes inside the call and applies the
// layer's rule here to the inputs' channels. A call that reads anything else is walked op by op,
// where the ops the tracer does not know make its channels unprunable.
#include <optional>
#include <set>

#include <fmt/format.h>

#include <strata/core/error.hpp>
#include <strata/nn/attention.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/instancenorm.hpp>
#include <strata/nn/normalization.hpp>

#include "compress/depgraph_internal.h"

namespace strata::compress::detail {

std::vector<int64_t> tie_conv(Labels& labels, nn::Module* conv, int64_t in, int64_t out, int64_t groups,
                              const std::vector<int64_t>& x) {
  const auto& in_labels = labels.layer(conv, ChannelRole::In, in);
  const auto& out_labels = labels.layer(conv, ChannelRole::Out, out);
  labels.unite(x, in_labels);
  // a grouped convolution's group reads only its own input channels: a unit is a whole group
  const int64_t in_per = in / groups, out_per = out / groups;
  if (groups > 1)
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 1; i < in_per; ++i) labels.unite(in_labels[g * in_per], in_labels[g * in_per + i]);
      for (int64_t o = 0; o < out_per; ++o) labels.unite(in_labels[g * in_per], out_labels[g * out_per + o]);
    }
  return out_labels;
}

namespace {

// A convolution other than Conv2d (whose conv2d node the walk follows itself).
struct ConvSizes {
  Tensor weight;
  int64_t in = 0, out = 0, groups = 1;
};

template <class C> bool conv_sizes(nn::Module* m, ConvSizes& s) {
  auto* c = dynamic_cast<C*>(m);
  if (c != nullptr) s = {c->weight, c->in_channels, c->out_channels, c->options.groups};
  return c != nullptr;
}

bool other_conv(nn::Module* m, ConvSizes& s) {
  return conv_sizes<nn::Conv1d>(m, s) || conv_sizes<nn::Conv3d>(m, s) || conv_sizes<nn::ConvTranspose1d>(m, s) ||
         conv_sizes<nn::ConvTranspose2d>(m, s) || conv_sizes<nn::ConvTranspose3d>(m, s);
}

class Rule {
 public:
  Rule(Labels& labels, nn::Module* m, const std::vector<Channels>& inputs, const std::vector<Shape>& shapes,
       const Shape& out)
      : labels_(labels), m_(m), inputs_(inputs), shapes_(shapes), out_(out) {}

  Channels run() {
    if (inputs_.empty()) return refuse(fmt::format("a {} called without inputs", m_->name()));
    ConvSizes conv;
    if (other_conv(m_, conv)) return convolution(conv);
    if (auto* gn = dynamic_cast<nn::GroupNorm*>(m_)) return group_norm(*gn);
    if (auto* in = dynamic_cast<nn::InstanceNormBase*>(m_)) return instance_norm(*in);
    if (auto* e = dynamic_cast<nn::Embedding*>(m_)) return embedding(*e);
    if (auto* a = dynamic_cast<nn::MultiheadAttention*>(m_)) return attention(*a);
    if (auto* b = dynamic_cast<nn::EmbeddingBag*>(m_)) return embedding_bag(*b);
    if (auto* r = dynamic_cast<nn::RNNBase*>(m_)) return follow_recurrent(labels_, *r, inputs_, shapes_, out_);
    return refuse(fmt::format("a {}, which the dependency tracer does not know", m_->name()));
  }

 private:
  // Marks every followed input's channels; the output is not followed.
  Channels refuse(const std::string& why) {
    for (const Channels& c : inputs_)
      if (c.followed()) labels_.mark(c.labels, why);
    return Channels{-1, {}, "the output of " + why};
  }

  int64_t rank(size_t i) const { return static_cast<int64_t>(shapes_[i].size()); }

  // (N, C, *spatial) or unbatched (C, *spatial): the channels' dim counted from the right.
  Channels convolution(const ConvSizes& c) {
    if (!c.weight.defined()) return refuse(fmt::format("a {} whose weight a form replaced", m_->name()));
    const int64_t dim = rank(0) - (c.weight.dim() - 2) - 1;
    if (dim < 0) return refuse(fmt::format("a {} on an input of rank {}", m_->name(), rank(0)));
    const auto x = labels_at(labels_, inputs_[0], dim, c.in, "a " + m_->name());
    return Channels{dim, tie_conv(labels_, m_, c.in, c.out, c.groups, x), {}};
  }

  // A norm over channel dim `dim`: its channels are the input's, which pass through.
  std::vector<int64_t> norm(int64_t dim, int64_t channels) {
    const auto x = labels_at(labels_, inputs_[0], dim, channels, "a " + m_->name());
    labels_.unite(x, labels_.layer(m_, ChannelRole::Norm, channels));
    return x;
  }

  // The statistics are per group of channels: a unit is a whole group, so those that stay are
  // normalized as before.
  Channels group_norm(const nn::GroupNorm& gn) {
    if (rank(0) < 2) return refuse("a GroupNorm on an input of rank below 2");
    const auto x = norm(1, gn.num_channels);
    const int64_t per = gn.num_channels / gn.num_groups;
    for (size_t c = 0; c < x.size(); ++c) labels_.unite(x[c - c % static_cast<size_t>(per)], x[c]);
    return Channels{1, x, {}};
  }

  // Per-channel statistics over the positions; unbatched input has no batch dim.
  Channels instance_norm(const nn::InstanceNormBase& in) {
    const int64_t spatial = dynamic_cast<const nn::InstanceNorm1d*>(&in) != nullptr   ? 1
                            : dynamic_cast<const nn::InstanceNorm2d*>(&in) != nullptr ? 2
                                                                                      : -1;
    if (spatial < 0) return refuse(fmt::format("an {}, which the dependency tracer does not know", m_->name()));
    const int64_t dim = rank(0) - spatial - 1;
    if (dim < 0) return refuse(fmt::format("an {} on an input of rank {}", m_->name(), rank(0)));
    return Channels{dim, norm(dim, in.num_features), {}};
  }

  // A producer: its features are the output's last dim (the indices carry no channels).
  Channels embedding(const nn::Embedding& e) {
    if (!e.weight.defined()) return refuse("an Embedding whose weight a form replaced");
    refuse("an Embedding's indices");  // a float input read as indices is not followed through
    return Channels{static_cast<int64_t>(out_.size()) - 1, labels_.layer(m_, ChannelRole::Out, e.embedding_dim), {}};
  }

  // As an Embedding: its indices, offsets and per-sample weights carry no channels, and each
  // feature of a bag is reduced (sum, mean or max) over the bag's rows within that feature.
  Channels embedding_bag(const nn::EmbeddingBag& b) {
    if (!b.weight.defined()) return refuse("an EmbeddingBag whose weight a form replaced");
    refuse("an EmbeddingBag's indices, offsets or per-sample weights");
    return Channels{static_cast<int64_t>(out_.size()) - 1, labels_.layer(m_, ChannelRole::Out, b.embedding_dim), {}};
  }

  // Heads are units of their own (their q/k/v rows and out_proj columns, removed by
  // remove_heads). The query's features are the layer's inputs (in_proj_weight's or
  // q_proj_weight's columns), out_proj's rows its outputs, as a Linear's. With one
  // in_proj_weight the key and value are read through the same columns as the query (kdim =
  // vdim = embed_dim), so all three are tied; with separate weights the key's and value's
  // features (k_proj_weight's and v_proj_weight's columns) are roles of their own.
  Channels attention(const nn::MultiheadAttention& a) {
    if (!a.out_proj.weight.defined()) return refuse("a MultiheadAttention whose out_proj a form replaced");
    labels_.layer(m_, ChannelRole::Head, a.num_heads);
    const bool separate = !a.in_proj_weight.defined();
    const ChannelRole roles[3] = {ChannelRole::In, separate ? ChannelRole::Key : ChannelRole::In,
                                  separate ? ChannelRole::Value : ChannelRole::In};
    const int64_t widths[3] = {a.embed_dim, a.kdim, a.vdim};
    for (size_t i = 0; i < 3 && i < inputs_.size(); ++i)
      labels_.unite(labels_at(labels_, inputs_[i], rank(i) - 1, widths[i], "a MultiheadAttention"),
                    labels_.layer(m_, roles[i], widths[i]));
    for (size_t i = 3; i < inputs_.size(); ++i)  // masks: not channels
      if (inputs_[i].followed()) labels_.mark(inputs_[i].labels, "a mask given to a MultiheadAttention");
    const int64_t last = static_cast<int64_t>(out_.size()) - 1;
    return Channels{last, labels_.layer(m_, ChannelRole::Out, a.out_proj.out_features), {}};
  }

  Labels& labels_;
  nn::Module* m_;
  const std::vector<Channels>& inputs_;
  const std::vector<Shape>& shapes_;
  const Shape& out_;
};

}  // namespace

std::optional<std::set<const autograd::Node*>> nodes_inside(const TraceModules::Call& call) {
  std::set<const TensorImpl*> allowed;  // leaves the call may read
  std::set<const autograd::Node*> stops;  // its inputs' nodes
  for (const Tensor& p : call.module->parameters()) allowed.insert(p.impl_ptr().get());
  for (const Tensor& t : call.inputs) {
    if (!t.defined()) continue;
    if (t.grad_fn()) stops.insert(t.grad_fn().get());
    else allowed.insert(t.impl_ptr().get());
  }
  // an input returned as it was, or a node of several outputs (which the walk does not follow)
  if (stops.count(call.output.get()) || call.output->output_meta.size() != 1) return std::nullopt;
  std::set<const autograd::Node*> inside;
  std::vector<autograd::Node*> todo{call.output.get()};
  while (!todo.empty()) {
    autograd::Node* n = todo.back();
    todo.pop_back();
    for (const autograd::Edge& e : n->next_edges) {
      autograd::Node* child = e.node.get();
      if (child == nullptr || stops.count(child) || !inside.insert(child).second) continue;
      if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(child)) {
        if (!allowed.count(acc->leaf().get())) return std::nullopt;
        continue;
      }
      todo.push_back(child);
    }
  }
  return inside;
}

bool has_module_rule(const nn::Module* m) {
  ConvSizes unused;
  auto* mutable_m = const_cast<nn::Module*>(m);
  return other_conv(mutable_m, unused) || dynamic_cast<const nn::GroupNorm*>(m) != nullptr ||
         dynamic_cast<const nn::InstanceNormBase*>(m) != nullptr || dynamic_cast<const nn::Embedding*>(m) != nullptr ||
         dynamic_cast<const nn::MultiheadAttention*>(m) != nullptr ||
         dynamic_cast<const nn::EmbeddingBag*>(m) != nullptr || dynamic_cast<const nn::RNNBase*>(m) != nullptr;
}

Channels follow_module(Labels& labels, nn::Module* m, const std::vector<Channels>& inputs,
                       const std::vector<Shape>& shapes, const Shape& out) {
  return Rule(labels, m, inputs, shapes, out).run();
}

}  // namespace strata::compress::detail
