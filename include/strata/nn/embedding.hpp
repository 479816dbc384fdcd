// Embedding: a lookup table of num_embeddings vectors of embedding_dim, indexed by int64 or
// int32 tensors of any shape. Weight initialized from N(0, 1) as in PyTorch, with the
// padding_idx row (if any) zero and excluded from gradient updates. EmbeddingBag reduces bags of
// lookups. Both hand their forward to a form when one is set (Note [Linear forms] in
// nn/layer_form.hpp): quant::quantize_dynamic's row-wise quantized weights.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/layer_form.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct EmbeddingOptions {
  std::optional<int64_t> padding_idx;  // negative counts from the end
  Generator* generator = nullptr;
};

class Embedding;
class EmbeddingBag;
using EmbeddingForm = LayerForm<Embedding>;

/// A form of an EmbeddingBag: its forward takes the inputs of EmbeddingBag::forward as given.
class EmbeddingBagForm : public Module {
 public:
  virtual Tensor forward_bags(const EmbeddingBag& layer, const Tensor& indices, const Tensor& offsets,
                              const Tensor& per_sample_weights) = 0;
  /// Whether the form holds the weight itself (then the layer's float weight is dropped).
  virtual bool replaces_weight() const = 0;
};

class STRATA_API Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  /// indices of shape (*) -> (*, embedding_dim).
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }
  void reset_parameters(Generator* gen = nullptr);
  /// Hands the forward to `form` (Note [Linear forms]); raises when the layer has one already.
  EmbeddingForm& set_form(std::string name, std::unique_ptr<EmbeddingForm> form);
  EmbeddingForm* form() const { return form_.get(); }

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalized to [0, num_embeddings)
  Tensor weight;                       // (num_embeddings, embedding_dim); undefined once a form replaced it

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<Embedding>;
  FormSlot<Embedding> form_;
};

struct EmbeddingBagOptions {
  EmbeddingBagMode mode = EmbeddingBagMode::Mean;
  std::optional<int64_t> padding_idx;  // entries of this index are left out of their bag
  bool include_last_offset = false;    // offsets has B + 1 entries, the last the number of indices
  Generator* generator = nullptr;
};

/// Sums, means or maxima of bags of embeddings without materializing the (indices, dim)
/// lookup in the caller, as torch.nn.EmbeddingBag; its weight is an Embedding's.
class STRATA_API EmbeddingBag : public Module {
 public:
  EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, EmbeddingBagOptions options = {});
  /// indices (B, N): each row a bag; or 1-d indices with offsets (B), each bag starting at its
  /// offset. per_sample_weights (indices' shape) scale the rows (Sum only). -> (B, embedding_dim)
  Tensor forward(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights = Tensor());
  /// forward(indices, {}) for 2-d indices.
  Tensor forward(const Tensor& indices) override;
  /// forward(indices, offsets, ...) with the hooks around it: their inputs are {indices, offsets,
  /// per_sample_weights} (undefined where not given).
  Tensor operator()(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights = Tensor());
  using Module::operator();
  std::string name() const override { return "EmbeddingBag"; }
  void reset_parameters(Generator* gen = nullptr);
  /// Hands the forward to `form` (Note [Linear forms]); raises when the layer has one already.
  EmbeddingBagForm& set_form(std::string name, std::unique_ptr<EmbeddingBagForm> form);
  EmbeddingBagForm* form() const { return form_.get(); }

  int64_t num_embeddings, embedding_dim;
  EmbeddingBagOptions options;  // padding_idx normalized to [0, num_embeddings)
  Tensor weight;                // (num_embeddings, embedding_dim); undefined once a form replaced it

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<EmbeddingBag, EmbeddingBagForm>;
  FormSlot<EmbeddingBag, EmbeddingBagForm> form_;
};

}  // namespace strata::nn
