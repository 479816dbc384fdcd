// Embedding: a lookup table of num_embeddings vectors of embedding_dim, indexed by int64 or
// int32 tensors of any shape. Weight initialized from N(0, 1) as in PyTorch, with the
// padding_idx row (if any) zero and excluded from gradient updates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct EmbeddingOptions {
  std::optional<int64_t> padding_idx;  // negative counts from the end
  Generator* generator = nullptr;
};

class STRATA_API Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  /// indices of shape (*) -> (*, embedding_dim).
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalized to [0, num_embeddings)
  Tensor weight;                       // (num_embeddings, embedding_dim)
};

}  // namespace strata::nn
