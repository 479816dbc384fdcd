// The LibTorch twin of examples/transformer/gpt.hpp, shared by bench_train's GPT workload
// (train_torch.cpp) and the Transformer example's twin (transformer_torch.cpp): token and
// learned position embeddings, pre-LayerNorm blocks of causal multi-head attention and a
// tanh-GELU MLP, a final LayerNorm and an output projection tied to the token embedding.
// Parameter names, shapes and registration order are those of the strata model. LibTorch 1.13
// has no fused scaled_dot_product_attention, so attention is the usual
// matmul-mask-softmax-(dropout)-matmul, with dropout on the attention weights as strata's SDPA.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace bench {

struct GptConfig {
  int64_t vocab = 256;
  int64_t context = 128;
  int64_t layers = 4;
  int64_t width = 256;
  int64_t heads = 4;
  double dropout = 0.0;
};

struct GptBlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln_1, ln_2;
  torch::nn::Linear c_attn, c_proj, mlp_fc, mlp_proj;
  torch::Tensor mask;  // (context, context), true above the diagonal
  int64_t heads;
  double dropout;

  explicit GptBlockImpl(const GptConfig& c)
      : ln_1(torch::nn::LayerNormOptions({c.width})), ln_2(torch::nn::LayerNormOptions({c.width})),
        c_attn(c.width, 3 * c.width), c_proj(c.width, c.width), mlp_fc(c.width, 4 * c.width),
        mlp_proj(4 * c.width, c.width), heads(c.heads), dropout(c.dropout) {
    register_module("ln_1", ln_1);
    register_module("c_attn", c_attn);
    register_module("c_proj", c_proj);
    register_module("ln_2", ln_2);
    register_module("mlp_fc", mlp_fc);
    register_module("mlp_proj", mlp_proj);
    mask = register_buffer("mask", torch::ones({c.context, c.context}, torch::kBool).triu(1));
  }
  torch::Tensor attention(const torch::Tensor& x) {  // (B, T, C)
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads;
    auto qkv = c_attn(x).split(C, 2);
    auto split_heads = [&](int i) { return qkv[i].view({B, T, heads, hd}).transpose(1, 2); };  // (B, H, T, hd)
    torch::Tensor att = torch::matmul(split_heads(0), split_heads(1).transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
    att = torch::softmax(att.masked_fill(mask.slice(0, 0, T).slice(1, 0, T), -INFINITY), -1);  // (B, H, T, T)
    if (is_training() && dropout > 0) att = torch::dropout(att, dropout, /*train=*/true);
    return c_proj(torch::matmul(att, split_heads(2)).transpose(1, 2).reshape({B, T, C}));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = x + attention(ln_1(x));
    return h + mlp_proj(torch::gelu(mlp_fc(ln_2(h)), "tanh"));
  }
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  GptConfig config;
  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f;

  explicit GptImpl(const GptConfig& c)
      : config(c), wte(c.vocab, c.width), wpe(c.context, c.width), ln_f(torch::nn::LayerNormOptions({c.width})) {
    register_module("wte", wte);
    register_module("wpe", wpe);
    for (int64_t i = 0; i < c.layers; ++i) h->push_back(GptBlock(c));
    register_module("h", h);
    register_module("ln_f", ln_f);
    // GPT-2 initialisation, as the strata model: normal(0, 0.02), residual projections scaled
    // by 1/sqrt(2 * layers)
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.value().dim() < 2) continue;
      p.value().normal_(0.0, is_residual_projection(p.key()) ? 0.02 / std::sqrt(2.0 * double(c.layers)) : 0.02);
    }
  }
  static bool is_residual_projection(const std::string& name) {
    return name.find("c_proj.weight") != std::string::npos || name.find("mlp_proj.weight") != std::string::npos;
  }
  torch::Tensor forward(torch::Tensor tokens) {  // (B, T) int64 -> (B, T, vocab)
    TORCH_CHECK(tokens.size(1) <= config.context, "[GPT] sequence of ", tokens.size(1), " tokens exceeds the context of ",
                config.context);
    torch::Tensor pos = torch::arange(tokens.size(1), torch::TensorOptions(torch::kLong).device(tokens.device()));
    torch::Tensor x = wte(tokens) + wpe(pos);
    for (const auto& b : *h) x = b->as<GptBlock>()->forward(x);
    return torch::matmul(ln_f(x), wte->weight.t());  // tied output embedding
  }
};
TORCH_MODULE(Gpt);

}  // namespace bench
