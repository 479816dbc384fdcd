// quantize_dynamic: see include/strata/quant/quantize.hpp.
#include <strata/core/error.hpp>
#include <strata/quant/quantize.hpp>

#include "quant/forms.h"
#include "quant/module_walk.h"

namespace strata::quant {

int64_t quantize_dynamic(nn::Module& model, const QuantizeOptions& o) {
  const char* op = "quantize_dynamic";
  STRATA_CHECK(o.dtype == WeightDtype::Int8 || o.dtype == WeightDtype::Int4, "[{}] unknown weight dtype {}", op,
               static_cast<int>(o.dtype));
  const bool int4 = o.dtype == WeightDtype::Int4;
  STRATA_CHECK(!int4 || o.group_size == 32 || o.group_size == 64 || o.group_size == 128,
               "[{}] group_size must be 32, 64 or 128, got {}", op, o.group_size);
  const std::vector<detail::NamedLinear> layers = detail::linear_layers(model, o.filter);
  for (const auto& [name, layer] : layers) {  // refuse before converting any
    STRATA_CHECK(layer->form() == nullptr, "[{}] layer \"{}\" is quantized or prepared for QAT already ({})", op,
                 name, layer->form() ? layer->form()->name() : "");
    STRATA_CHECK(!int4 || layer->in_features % o.group_size == 0,
                 "[{}] group_size {} does not divide in_features {} of layer \"{}\"", op, o.group_size,
                 layer->in_features, name);
    STRATA_CHECK(int4 || layer->in_features <= (int64_t{1} << 16),
                 "[{}] layer \"{}\" has in_features {} > 2^16, past which int8 sums could overflow", op, name,
                 layer->in_features);
  }
  for (const auto& [name, layer] : layers) {
    if (int4) {
      layer->set_form("quantized", std::make_unique<detail::Int4LinearForm>(
                                       quantize_weight_int4(layer->weight, o.group_size, o.symmetric)));
    } else {
      layer->set_form("quantized",
                      std::make_unique<detail::Int8LinearForm>(quantize_weight_int8(layer->weight), std::nullopt));
    }
  }
  return static_cast<int64_t>(layers.size());
}

}  // namespace strata::quant
