// What the dependency graph's pruning needs of each kind of layer: the scores of its channels,
// how many it has, how to cut them out, and how to put its sizes back after a failed prune.
#include <tuple>

#include <fmt/format.h>

#include <strata/compress/heads.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/attention.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/instancenorm.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/normalization.hpp>
#include <strata/ops/creation.hpp>

#include "compress/depgraph_internal.h"
#include "compress/prune_internal.h"

namespace strata::compress::detail {

namespace {

// A convolution's sizes and weight, whatever its rank. Its weight holds every channel of one
// role along dim 0 (the outputs; a transposed convolution's inputs) and each group's channels of
// the other role along dim 1.
struct ConvLayer {
  Tensor weight, bias;
  int64_t *in = nullptr, *out = nullptr, *groups = nullptr;
  bool transposed = false;
  int64_t dim_of(ChannelRole role) const { return (role == ChannelRole::Out) == transposed ? 1 : 0; }
};

template <class C> bool as_conv(nn::Module* m, ConvLayer& c, bool transposed) {
  auto* typed = dynamic_cast<C*>(m);
  if (typed != nullptr)
    c = {typed->weight, typed->bias, &typed->in_channels, &typed->out_channels, &typed->options.groups, transposed};
  return typed != nullptr;
}

bool conv_layer(const nn::Module* module, ConvLayer& c) {
  auto* m = const_cast<nn::Module*>(module);  // the sizes are only read for a const module
  return as_conv<nn::Conv1d>(m, c, false) || as_conv<nn::Conv2d>(m, c, false) || as_conv<nn::Conv3d>(m, c, false) ||
         as_conv<nn::ConvTranspose1d>(m, c, true) || as_conv<nn::ConvTranspose2d>(m, c, true) ||
         as_conv<nn::ConvTranspose3d>(m, c, true);
}

Tensor kept_index(int64_t n, const std::set<int64_t>& removed) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i)
    if (!removed.count(i)) kept.push_back(i);
  return from_vector(kept);
}

void shrink_conv(ConvLayer& c, const std::map<ChannelRole, std::set<int64_t>>& roles) {
  const int64_t groups = *c.groups, in_per = *c.in / groups, out_per = *c.out / groups;
  for (const auto& [role, removed] : roles) {
    int64_t& count = role == ChannelRole::Out ? *c.out : *c.in;
    const Tensor index = kept_index(count, removed);
    // a grouped convolution's dim 1 has each group's channels: whole groups go, it stays
    if (c.dim_of(role) == 0 || groups == 1) detail::take_slices(c.weight, c.dim_of(role), index);
    if (role == ChannelRole::Out) detail::take_slices(c.bias, 0, index);
    count = index.numel();
  }
  if (groups == 1) return;
  // whole groups went (Note [Channel labels]): in and out shrink by the same number of them
  *c.groups = *c.out / out_per;
  STRATA_CHECK(*c.out % out_per == 0 && *c.in == *c.groups * in_per,
               "[DependencyGraph] internal: grouped convolution left with {} in and {} out channels in {} groups",
               *c.in, *c.out, *c.groups);
}

// The per-channel parameters and buffers of a norm (undefined ones are skipped by take_slices).
std::vector<Tensor> norm_tensors(nn::Module* m) {
  if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m)) return {bn->weight, bn->bias, bn->running_mean, bn->running_var};
  if (auto* in = dynamic_cast<nn::InstanceNormBase*>(m))
    return {in->weight, in->bias, in->running_mean, in->running_var};
  if (auto* ln = dynamic_cast<nn::LayerNorm*>(m)) return {ln->weight, ln->bias};
  if (auto* gn = dynamic_cast<nn::GroupNorm*>(m)) return {gn->weight, gn->bias};
  if (auto* rms = dynamic_cast<nn::RMSNorm*>(m)) return {rms->weight};
  return {};
}

// Heads by remove_heads; the features in (in_proj_weight's columns: query, key and value) and
// out (out_proj's rows) as a Linear's.
void shrink_attention(nn::MultiheadAttention& a, const std::map<ChannelRole, std::set<int64_t>>& roles) {
  if (auto it = roles.find(ChannelRole::Head); it != roles.end())
    remove_heads(a, std::vector<int64_t>(it->second.begin(), it->second.end()));
  const bool separate = !a.in_proj_weight.defined();
  if (auto it = roles.find(ChannelRole::In); it != roles.end()) {
    const Tensor index = kept_index(a.embed_dim, it->second);
    take_slices(separate ? a.q_proj_weight : a.in_proj_weight, 1, index);
    a.embed_dim = index.numel();
    if (!separate) a.kdim = a.vdim = a.embed_dim;
  }
  for (auto [role, weight, width] : {std::tuple{ChannelRole::Key, a.k_proj_weight, &a.kdim},
                                     std::tuple{ChannelRole::Value, a.v_proj_weight, &a.vdim}})
    if (auto it = roles.find(role); it != roles.end()) {
      const Tensor index = kept_index(*width, it->second);
      take_slices(weight, 1, index);
      *width = index.numel();
    }
  if (auto it = roles.find(ChannelRole::Out); it != roles.end()) {
    const Tensor index = kept_index(a.out_proj.out_features, it->second);
    take_slices(a.out_proj.weight, 0, index);
    take_slices(a.out_proj.bias, 0, index);
    a.out_proj.out_features = index.numel();
  }
}

}  // namespace

std::vector<double> member_scores(const GroupMember& m, Importance kind) {
  auto along = [&](const Tensor& w, int64_t dim) { return host_values(channel_importance(w, kind, dim)); };
  const std::vector<double> none(static_cast<size_t>(layer_channels(m.module, m.role)), 0.0);
  if (ConvLayer c; conv_layer(m.module, c))  // a grouped convolution's dim 1 has no slice per channel
    return c.dim_of(m.role) == 1 && *c.groups > 1 ? none : along(c.weight, c.dim_of(m.role));
  if (auto* l = dynamic_cast<nn::Linear*>(m.module)) return along(l->weight, m.role == ChannelRole::Out ? 0 : 1);
  if (auto* e = dynamic_cast<nn::Embedding*>(m.module)) return along(e->weight, 1);
  if (auto* b = dynamic_cast<nn::EmbeddingBag*>(m.module)) return along(b->weight, 1);
  if (auto* r = dynamic_cast<nn::RNNBase*>(m.module)) return recurrent_scores(*r, m.role, kind);
  if (auto* a = dynamic_cast<nn::MultiheadAttention*>(m.module)) {
    if (m.role == ChannelRole::Head) return host_values(head_importance(*a, kind));
    if (m.role == ChannelRole::Key) return along(a->k_proj_weight, 1);
    if (m.role == ChannelRole::Value) return along(a->v_proj_weight, 1);
    if (m.role == ChannelRole::In) return along(a->in_proj_weight.defined() ? a->in_proj_weight : a->q_proj_weight, 1);
    return along(a->out_proj.weight, 0);
  }
  const std::vector<Tensor> norm = norm_tensors(m.module);
  return !norm.empty() && norm[0].defined() ? along(norm[0], 0) : none;
}

int64_t layer_channels(const nn::Module* m, ChannelRole role) {
  const bool out = role == ChannelRole::Out;
  if (ConvLayer c; conv_layer(m, c)) return out ? *c.out : *c.in;
  if (const auto* l = dynamic_cast<const nn::Linear*>(m)) return out ? l->out_features : l->in_features;
  if (const auto* bn = dynamic_cast<const nn::BatchNormBase*>(m)) return bn->num_features;
  if (const auto* in = dynamic_cast<const nn::InstanceNormBase*>(m)) return in->num_features;
  if (const auto* ln = dynamic_cast<const nn::LayerNorm*>(m)) return ln->normalized_shape.back();
  if (const auto* gn = dynamic_cast<const nn::GroupNorm*>(m)) return gn->num_channels;
  if (const auto* rms = dynamic_cast<const nn::RMSNorm*>(m)) return rms->normalized_shape.back();
  if (const auto* e = dynamic_cast<const nn::Embedding*>(m)) return e->embedding_dim;
  if (const auto* b = dynamic_cast<const nn::EmbeddingBag*>(m)) return b->embedding_dim;
  if (const auto* r = dynamic_cast<const nn::RNNBase*>(m)) return out ? r->hidden_size : r->input_size;
  if (const auto* a = dynamic_cast<const nn::MultiheadAttention*>(m))
    return role == ChannelRole::Head    ? a->num_heads
           : role == ChannelRole::Key   ? a->kdim
           : role == ChannelRole::Value ? a->vdim
           : out                        ? a->out_proj.out_features
                                        : a->embed_dim;
  return -1;
}

void shrink_layer(nn::Module* m, const std::map<ChannelRole, std::set<int64_t>>& roles) {
  if (ConvLayer c; conv_layer(m, c)) return shrink_conv(c, roles);
  if (auto* a = dynamic_cast<nn::MultiheadAttention*>(m)) return shrink_attention(*a, roles);
  if (auto* r = dynamic_cast<nn::RNNBase*>(m)) return shrink_recurrent(*r, roles);
  for (const auto& [role, removed] : roles) {
    const Tensor index = kept_index(layer_channels(m, role), removed);
    if (auto* l = dynamic_cast<nn::Linear*>(m)) {
      const bool out = role == ChannelRole::Out;
      take_slices(l->weight, out ? 0 : 1, index);
      if (out) take_slices(l->bias, 0, index);
      (out ? l->out_features : l->in_features) = index.numel();
      continue;
    }
    if (auto* e = dynamic_cast<nn::Embedding*>(m)) {
      take_slices(e->weight, 1, index);
      e->embedding_dim = index.numel();
      continue;
    }
    if (auto* b = dynamic_cast<nn::EmbeddingBag*>(m)) {
      take_slices(b->weight, 1, index);
      b->embedding_dim = index.numel();
      continue;
    }
    for (const Tensor& t : norm_tensors(m)) take_slices(t, 0, index);
    if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m)) bn->num_features = index.numel();
    if (auto* in = dynamic_cast<nn::InstanceNormBase*>(m)) in->num_features = index.numel();
    if (auto* ln = dynamic_cast<nn::LayerNorm*>(m)) ln->normalized_shape = {index.numel()};
    if (auto* rms = dynamic_cast<nn::RMSNorm*>(m)) rms->normalized_shape = {index.numel()};
    if (auto* gn = dynamic_cast<nn::GroupNorm*>(m)) {
      // whole groups went (depgraph_modules.cpp): the channels per group stay
      const int64_t per = gn->num_channels / gn->num_groups;
      STRATA_CHECK(index.numel() % per == 0, "[DependencyGraph] internal: GroupNorm left with {} channels in groups "
                   "of {}", index.numel(), per);
      gn->num_channels = index.numel(), gn->num_groups = index.numel() / per;
    }
  }
}

std::vector<nn::Module*> shrunk_modules(nn::Module& m) {
  if (auto* a = dynamic_cast<nn::MultiheadAttention*>(&m)) return {&m, &a->out_proj};
  return {&m};
}

std::function<void()> saved_sizes(nn::Module& m) {
  if (ConvLayer c; conv_layer(&m, c))
    return [c, in = *c.in, out = *c.out, groups = *c.groups] { *c.in = in, *c.out = out, *c.groups = groups; };
  if (auto* l = dynamic_cast<nn::Linear*>(&m))
    return [l, in = l->in_features, out = l->out_features] { l->in_features = in, l->out_features = out; };
  if (auto* bn = dynamic_cast<nn::BatchNormBase*>(&m)) return [bn, n = bn->num_features] { bn->num_features = n; };
  if (auto* in = dynamic_cast<nn::InstanceNormBase*>(&m)) return [in, n = in->num_features] { in->num_features = n; };
  if (auto* ln = dynamic_cast<nn::LayerNorm*>(&m))
    return [ln, shape = ln->normalized_shape] { ln->normalized_shape = shape; };
  if (auto* rms = dynamic_cast<nn::RMSNorm*>(&m))
    return [rms, shape = rms->normalized_shape] { rms->normalized_shape = shape; };
  if (auto* gn = dynamic_cast<nn::GroupNorm*>(&m))
    return [gn, c = gn->num_channels, g = gn->num_groups] { gn->num_channels = c, gn->num_groups = g; };
  if (auto* e = dynamic_cast<nn::Embedding*>(&m)) return [e, d = e->embedding_dim] { e->embedding_dim = d; };
  if (auto* b = dynamic_cast<nn::EmbeddingBag*>(&m)) return [b, d = b->embedding_dim] { b->embedding_dim = d; };
  if (auto* r = dynamic_cast<nn::RNNBase*>(&m))
    return [r, in = r->input_size, h = r->hidden_size, s = r->state_size] {
      r->input_size = in, r->hidden_size = h, r->state_size = s;
    };
  if (auto* a = dynamic_cast<nn::MultiheadAttention*>(&m))  // remove_heads shrinks out_proj's inputs too
    return [a, h = a->num_heads, e = a->embed_dim, k = a->kdim, v = a->vdim, in = a->out_proj.in_features,
            out = a->out_proj.out_features] {
      a->num_heads = h, a->embed_dim = e, a->kdim = k, a->vdim = v;
      a->out_proj.in_features = in, a->out_proj.out_features = out;
    };
  return [] {};
}

}  // namespace strata::compress::detail
