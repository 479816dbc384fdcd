// A GPT-style decoder-only language model built from strata's nn layers: token and learned
// position embeddings, pre-LayerNorm blocks of causal multi-head attention and a GELU MLP,
// a final LayerNorm, and an output projection tied to the token embedding.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include <strata/strata.hpp>

namespace gpt {

namespace st = strata;
namespace F = strata::nn::functional;

struct Config {
  int64_t vocab = 256;  // bytes
  int64_t context = 128;
  int64_t layers = 4;
  int64_t width = 256;
  int64_t heads = 4;
  double dropout = 0.0;
};

class CausalSelfAttention : public st::nn::Module {
 public:
  CausalSelfAttention(const Config& c)
      : heads_(c.heads), qkv_(c.width, 3 * c.width), proj_(c.width, c.width), dropout_(c.dropout) {
    register_module("c_attn", qkv_);
    register_module("c_proj", proj_);
  }
  st::Tensor forward(const st::Tensor& x) override {  // (B, T, C)
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads_;
    // one split (not three narrows), so that the gradient of qkv is one concatenation
    const std::vector<st::Tensor> qkv = st::split(qkv_(x), C, 2);          // 3 x (B, T, C)
    auto heads = [&](int64_t i) {                                           // (B, H, T, hd)
      return qkv[static_cast<size_t>(i)].view({B, T, heads_, hd}).transpose(1, 2);
    };
    st::Tensor y = F::scaled_dot_product_attention(heads(0), heads(1), heads(2), {}, is_training() ? dropout_ : 0.0,
                                                   /*is_causal=*/true);
    return proj_(y.transpose(1, 2).reshape({B, T, C}));
  }
  std::string name() const override { return "CausalSelfAttention"; }

 private:
  int64_t heads_;
  st::nn::Linear qkv_, proj_;
  double dropout_;
};

class Block : public st::nn::Module {
 public:
  Block(const Config& c)
      : ln1_(st::Shape{c.width}), attn_(c), ln2_(st::Shape{c.width}), fc_(c.width, 4 * c.width),
        proj_(4 * c.width, c.width) {
    register_module("ln_1", ln1_);
    register_module("attn", attn_);
    register_module("ln_2", ln2_);
    register_module("mlp_fc", fc_);
    register_module("mlp_proj", proj_);
  }
  st::Tensor forward(const st::Tensor& x) override {
    st::Tensor h = x + attn_(ln1_(x));
    return h + proj_(st::gelu(fc_(ln2_(h)), "tanh"));
  }
  std::string name() const override { return "Block"; }

 private:
  st::nn::LayerNorm ln1_;
  CausalSelfAttention attn_;
  st::nn::LayerNorm ln2_;
  st::nn::Linear fc_, proj_;
};

class GPT : public st::nn::Module {
 public:
  explicit GPT(const Config& c) : config_(c), wte_(c.vocab, c.width), wpe_(c.context, c.width), ln_f_(st::Shape{c.width}) {
    register_module("wte", wte_);
    register_module("wpe", wpe_);
    for (int64_t i = 0; i < c.layers; ++i) blocks_.push_back(Block(c));
    register_module("h", blocks_);
    register_module("ln_f", ln_f_);
    // GPT-2 initialisation: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)
    st::NoGradGuard no_grad;
    for (auto& [name, p] : named_parameters()) {
      if (p.dim() < 2) continue;
      double std = 0.02;
      if (name.find("c_proj.weight") != std::string::npos || name.find("mlp_proj.weight") != std::string::npos)
        std /= std::sqrt(2.0 * static_cast<double>(c.layers));
      st::Tensor t = p;
      st::normal_(t, 0.0, std);
    }
  }

  // tokens: (B, T) int64 -> logits (B, T, vocab)
  st::Tensor forward(const st::Tensor& tokens) override {
    const int64_t T = tokens.size(1);
    STRATA_CHECK(T <= config_.context, "[GPT] sequence of {} tokens exceeds the context of {}", T, config_.context);
    st::Tensor pos = st::arange(T, st::TensorOptions(st::kInt64, tokens.device()));
    st::Tensor x = wte_(tokens) + wpe_(pos);
    for (st::nn::Module* b : blocks_) x = b->forward(x);
    x = ln_f_(x);
    return st::matmul(x, wte_.weight.t());  // tied output embedding
  }
  std::string name() const override { return "GPT"; }
  const Config& config() const { return config_; }

 private:
  Config config_;
  st::nn::Embedding wte_, wpe_;
  st::nn::ModuleList blocks_;
  st::nn::LayerNorm ln_f_;
};

}  // namespace gpt
