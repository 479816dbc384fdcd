// quantize_dynamic's recurrent layers and cells (src/quant/qrecurrent.cpp).
#pragma once

#include <memory>
#include <vector>

#include <strata/nn/recurrent.hpp>
#include <strata/quant/quantize.hpp>

namespace strata::quant::detail {

/// A recurrent layer or cell and the form that will take its products.
struct RecurrentConversion {
  nn::Module* layer;
  std::unique_ptr<nn::RecurrentForm> form;
};

/// The forms of every recurrent layer and cell of `model` that the options name, made (weights
/// quantized) without changing the model; raises on a layer quantized already.
std::vector<RecurrentConversion> recurrent_conversions(nn::Module& model, const QuantizeOptions& options);
/// Hands the layer its form (its float weights are dropped).
void apply_conversion(RecurrentConversion& conversion);

}  // namespace strata::quant::detail
