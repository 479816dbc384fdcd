// quantize_dynamic: see include/strata/quant/quantize.hpp.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/quant/quantize.hpp>

#include "quant/forms.h"
#include "quant/module_walk.h"
#include "quant/qrecurrent.h"

namespace strata::quant {

namespace {

// The Embedding and EmbeddingBag layers the options name, checked unquantized.
std::vector<std::pair<std::string, nn::Module*>> embedding_layers(nn::Module& model, const QuantizeOptions& o) {
  std::vector<std::pair<std::string, nn::Module*>> out;
  if (o.embeddings == EmbeddingDtype::None) return out;
  for (auto& [name, m] : model.named_modules()) {
    auto* e = dynamic_cast<nn::Embedding*>(m);
    auto* bag = dynamic_cast<nn::EmbeddingBag*>(m);
    if ((!e && !bag) || (o.embedding_filter && !o.embedding_filter(name, *m))) continue;
    const nn::Module* form = e ? static_cast<const nn::Module*>(e->form()) : bag->form();
    STRATA_CHECK(form == nullptr, "[quantize_dynamic] layer \"{}\" is quantized already ({})", name,
                 form ? form->name() : "");
    out.emplace_back(name, m);
  }
  return out;
}

}  // namespace

int64_t quantize_dynamic(nn::Module& model, const QuantizeOptions& o) {
  const char* op = "quantize_dynamic";
  STRATA_CHECK(o.dtype == WeightDtype::Int8 || o.dtype == WeightDtype::Int4 || o.dtype == WeightDtype::Float16,
               "[{}] unknown weight dtype {}", op, static_cast<int>(o.dtype));
  const bool int4 = o.dtype == WeightDtype::Int4;
  STRATA_CHECK(!int4 || o.group_size == 32 || o.group_size == 64 || o.group_size == 128,
               "[{}] group_size must be 32, 64 or 128, got {}", op, o.group_size);
  STRATA_CHECK(o.embeddings == EmbeddingDtype::None || o.embeddings == EmbeddingDtype::UInt8 ||
                   o.embeddings == EmbeddingDtype::UInt4,
               "[{}] unknown embedding dtype {}", op, static_cast<int>(o.embeddings));
  const std::vector<detail::NamedLinear> layers = detail::linear_layers(model, o.filter);
  const auto embeddings = embedding_layers(model, o);
  std::vector<detail::RecurrentConversion> recurrent = detail::recurrent_conversions(model, o);
  for (const auto& [name, layer] : layers) {  // refuse before converting any
    STRATA_CHECK(layer->form() == nullptr, "[{}] layer \"{}\" is quantized or prepared for QAT already ({})", op,
                 name, layer->form() ? layer->form()->name() : "");
    STRATA_CHECK(!int4 || layer->in_features % o.group_size == 0,
                 "[{}] group_size {} does not divide in_features {} of layer \"{}\"", op, o.group_size,
                 layer->in_features, name);
    STRATA_CHECK(o.dtype != WeightDtype::Int8 || layer->in_features <= (int64_t{1} << 16),
                 "[{}] layer \"{}\" has in_features {} > 2^16, past which int8 sums could overflow", op, name,
                 layer->in_features);
  }
  // the embeddings' forms made before any layer changes, so that one raising leaves the model as it was
  const int bits = o.embeddings == EmbeddingDtype::UInt4 ? 4 : 8;
  std::vector<std::pair<nn::Embedding*, std::unique_ptr<nn::EmbeddingForm>>> embedding_forms;
  std::vector<std::pair<nn::EmbeddingBag*, std::unique_ptr<nn::EmbeddingBagForm>>> bag_forms;
  for (const auto& [name, m] : embeddings) {
    if (auto* e = dynamic_cast<nn::Embedding*>(m)) {
      embedding_forms.emplace_back(e, detail::rowwise_form(*e, bits));
    } else {
      auto* bag = static_cast<nn::EmbeddingBag*>(m);
      bag_forms.emplace_back(bag, detail::rowwise_form(*bag, bits));
    }
  }
  for (const auto& [name, layer] : layers) {
    if (int4) {
      layer->set_form("quantized", std::make_unique<detail::Int4LinearForm>(
                                       quantize_weight_int4(layer->weight, o.group_size, o.symmetric)));
    } else if (o.dtype == WeightDtype::Float16) {
      layer->set_form("quantized", std::make_unique<detail::Float16LinearForm>(layer->weight));
    } else {
      layer->set_form("quantized",
                      std::make_unique<detail::Int8LinearForm>(quantize_weight_int8(layer->weight), std::nullopt));
    }
  }
  for (auto& [layer, form] : embedding_forms) layer->set_form("quantized", std::move(form));
  for (auto& [layer, form] : bag_forms) layer->set_form("quantized", std::move(form));
  for (auto& c : recurrent) detail::apply_conversion(c);
  return static_cast<int64_t>(layers.size() + embeddings.size() + recurrent.size());
}

}  // namespace strata::quant
