// prepare_qat and convert: see include/strata/quant/qat.hpp.
#include <strata/quant/qat.hpp>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/functional.hpp>
#include <strata/quant/qtensor.hpp>

#include "quant/forms.h"
#include "quant/module_walk.h"

namespace strata::quant {

namespace detail {

QatLinearForm::QatLinearForm(std::unique_ptr<FakeQuantize> input_fq, std::unique_ptr<FakeQuantize> weight_fq) {
  STRATA_CHECK(input_fq && weight_fq, "[prepare_qat] a fake quant factory returned null");
  input_fq_ = &register_module("input_fake_quant", std::move(input_fq));
  weight_fq_ = &register_module("weight_fake_quant", std::move(weight_fq));
}

Tensor QatLinearForm::forward_linear(const nn::Linear& layer, const Tensor& input) {
  return nn::functional::linear((*input_fq_)(input), (*weight_fq_)(layer.weight), layer.bias);
}

}  // namespace detail

int64_t prepare_qat(nn::Module& model, const QatOptions& o) {
  const std::vector<detail::NamedLinear> layers = detail::linear_layers(model, o.filter);
  for (const auto& [name, layer] : layers)
    STRATA_CHECK(layer->form() == nullptr, "[prepare_qat] layer \"{}\" is quantized or prepared already ({})", name,
                 layer->form() ? layer->form()->name() : "");
  for (const auto& [name, layer] : layers) {
    auto input_fq = o.input_fake_quant ? o.input_fake_quant() : default_fake_quant();
    auto weight_fq = o.weight_fake_quant ? o.weight_fake_quant(layer->out_features)
                                         : default_weight_fake_quant(layer->out_features);
    layer->set_form("qat", std::make_unique<detail::QatLinearForm>(std::move(input_fq), std::move(weight_fq)));
  }
  return static_cast<int64_t>(layers.size());
}

int64_t convert(nn::Module& model) {
  std::vector<std::pair<std::string, nn::Linear*>> prepared;
  for (const auto& entry : detail::linear_layers(model, nullptr)) {
    auto* qat = dynamic_cast<detail::QatLinearForm*>(entry.second->form());
    if (!qat) continue;
    const FakeQuantize& w = qat->weight_fake_quant();
    const Observer& wo = w.observer();
    STRATA_CHECK(wo.per_channel() && is_symmetric(wo.options().qscheme) && wo.options().ch_axis == 0 &&
                     wo.options().dtype == kInt8 && w.quant_min() == -128 && w.quant_max() == 127,
                 "[convert] layer \"{}\": the weight observer must be int8 [-128, 127], per-channel symmetric along "
                 "dim 0",
                 entry.first);
    STRATA_CHECK(!qat->input_fake_quant().per_channel(),
                 "[convert] layer \"{}\": the input observer must be per tensor", entry.first);
    prepared.push_back(entry);
  }
  for (const auto& [name, layer] : prepared) {
    auto* qat = static_cast<detail::QatLinearForm*>(layer->form());
    FakeQuantize& in = qat->input_fake_quant();
    FakeQuantize& w = qat->weight_fake_quant();
    NoGradGuard no_grad;
    // the qparams the fake quants used last (the buffers), so the int8 layer matches them
    QuantizedTensor q = quantize_per_channel(layer->weight, w.scale.to(layer->weight.device()),
                                             w.zero_point.to(layer->weight.device()), 0, kInt8);
    detail::Int8LinearForm::StaticInput input{in.scale.clone(), in.zero_point.clone(),
                                              QRange{in.quant_min(), in.quant_max()}};
    std::unique_ptr<nn::LinearForm> old = layer->take_form();
    layer->set_form("quantized", std::make_unique<detail::Int8LinearForm>(Int8Weight{q.int_repr, q.scales}, input));
  }
  return static_cast<int64_t>(prepared.size());
}

}  // namespace strata::quant
