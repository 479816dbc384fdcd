// prepare_qat and convert (include/strata/quant/qat.hpp), and static quantization's prepare
// (include/strata/quant/quantize_static.hpp): forms put on the Linear, Conv2d, Conv1d and
// ConvTranspose2d layers, and the int8 forms convert puts in their place.
#include <strata/quant/qat.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/basic.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/quant/fuse.hpp>
#include <strata/quant/qtensor.hpp>
#include <strata/quant/quantize_static.hpp>
#include <strata/quant/stubs.hpp>

#include "quant/forms.h"
#include "quant/module_walk.h"
#include "quant/stubs.h"

namespace strata::quant {

namespace {

template <class Layer>
using LayerOf = std::remove_reference_t<Layer>;

// Checks every layer before any changes: no form yet, and zero padding (the int8 convolution pads
// with the zero point's code).
void check_unprepared(const std::vector<detail::QuantLayer>& layers, const char* op) {
  for (const auto& l : layers) {
    visit(l, [&](auto& layer) {
      STRATA_CHECK(layer.form() == nullptr, "[{}] layer \"{}\" is quantized or prepared already ({})", op, l.name,
                   layer.form() ? layer.form()->name() : "");
      STRATA_CHECK(detail::zero_padded(layer), "[{}] {} \"{}\" pads other than with zeros, which quantization does "
                   "not support", op, layer.name(), l.name);
    });
  }
}

std::unique_ptr<nn::LinearForm> int8_form(const nn::Linear&, Int8Weight w, detail::StaticActivations act) {
  return std::make_unique<detail::Int8LinearForm>(std::move(w), std::move(act));
}
std::unique_ptr<nn::Conv2dForm> int8_form(const nn::Conv2d&, Int8Weight w, detail::StaticActivations act) {
  return std::make_unique<detail::Int8Conv2dForm>(std::move(w), std::move(act));
}
std::unique_ptr<nn::Conv1dForm> int8_form(const nn::Conv1d&, Int8Weight w, detail::StaticActivations act) {
  return std::make_unique<detail::Int8Conv1dForm>(std::move(w), std::move(act));
}
std::unique_ptr<nn::ConvTranspose2dForm> int8_form(const nn::ConvTranspose2d&, Int8Weight w,
                                                   detail::StaticActivations act) {
  return std::make_unique<detail::Int8ConvTranspose2dForm>(std::move(w), std::move(act));
}

std::unique_ptr<nn::Linear> fold(const nn::Linear& l, nn::Module& bn) {
  return fuse_linear_bn_eval(l, dynamic_cast<nn::BatchNorm1d&>(bn));
}
std::unique_ptr<nn::Conv2d> fold(const nn::Conv2d& c, nn::Module& bn) {
  return fuse_conv_bn_eval(c, dynamic_cast<nn::BatchNorm2d&>(bn));
}
std::unique_ptr<nn::Conv1d> fold(const nn::Conv1d& c, nn::Module& bn) {
  return fuse_conv_bn_eval(c, dynamic_cast<nn::BatchNorm1d&>(bn));
}
std::unique_ptr<nn::ConvTranspose2d> fold(const nn::ConvTranspose2d&, nn::Module&) {
  STRATA_CHECK(false, "[convert] no fused module holds a ConvTranspose2d and a batch norm");
  return nullptr;
}

// A layer's weight, output channels on dim 0 (out_major), as the int8 form's (out, K) codes, per channel symmetric.
template <class Layer>
Int8Weight quantize_flat(const Layer& layer) {
  const Tensor w = detail::out_major(layer, layer.weight);
  return quantize_weight_int8(w.reshape({w.size(0), -1}));
}

using detail::calibrated;

using Filter = std::function<bool(const std::string&, const nn::Module&)>;

// The QuantStubs under `model` that `filter` accepts (all when null) at `stage`.
std::vector<std::pair<std::string, QuantStub*>> stubs_at(nn::Module& model, const Filter& filter,
                                                         QuantStub::Stage stage) {
  std::vector<std::pair<std::string, QuantStub*>> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* stub = dynamic_cast<QuantStub*>(m); stub && stub->stage() == stage && (!filter || filter(name, *m)))
      out.emplace_back(name, stub);
  return out;
}

detail::ActQParams qparams_of(const Observer& o) {
  auto [scale, zero] = o.calculate_qparams();
  return {scale.reshape({1}).to(kFloat32), zero.reshape({1}).to(kInt32), o.range()};
}

void check_qat(const detail::QuantLayer& l, const FakeQuantize& w, const FakeQuantize& in) {
  const Observer& wo = w.observer();
  STRATA_CHECK(wo.per_channel() && is_symmetric(wo.options().qscheme) && wo.options().ch_axis == 0 &&
                   wo.options().dtype == kInt8 && w.quant_min() == -128 && w.quant_max() == 127,
               "[convert] layer \"{}\": the weight observer must be int8 [-128, 127], per-channel symmetric along "
               "dim 0", l.name);
  STRATA_CHECK(!in.per_channel(), "[convert] layer \"{}\": the input observer must be per tensor", l.name);
}

// The int8 form of a prepared layer (QAT or observed), in the layer's place.
template <class Layer>
void convert_layer(Layer& layer, const detail::QuantLayer& l) {
  NoGradGuard no_grad;
  detail::StaticActivations act;
  if (auto* qat = dynamic_cast<detail::QatForm<Layer>*>(layer.form())) {
    const FakeQuantize& in = qat->input_fake_quant();
    const FakeQuantize& w = qat->weight_fake_quant();
    auto [in_scale, in_zero_point] = in.qparams();
    act.input = {in_scale, in_zero_point, QRange{in.quant_min(), in.quant_max()}};
    // the qparams the fake quants used last (the buffers), so the int8 layer matches them
    const auto quantized_with_fq = [&](const Layer& of) {
      const Tensor weight = detail::out_major(of, of.weight);
      const Device d = weight.device();
      auto [w_scale, w_zero_point] = w.qparams();
      QuantizedTensor q = quantize_per_channel(weight, w_scale.to(d), w_zero_point.to(d), 0, kInt8);
      return Int8Weight{q.int_repr.reshape({q.int_repr.size(0), -1}), q.scales};
    };
    if (l.fused && l.fused->has_batch_norm()) {
      // the batch norm's running statistics folded into a new layer, whose weight the fake quant
      // saw scaled the same way while training (QatForm)
      std::unique_ptr<Layer> folded = fold(layer, (*l.fused)[1]);
      folded->set_form("quantized", int8_form(*folded, quantized_with_fq(*folded), std::move(act)));
      l.fused->set_submodule("0", std::move(folded));  // the prepared layer goes
      l.fused->set_submodule("1", std::make_unique<nn::Identity>());
      return;
    }
    Int8Weight weight = quantized_with_fq(layer);
    std::unique_ptr<nn::LayerForm<Layer>> old = layer.take_form();
    layer.set_form("quantized", int8_form(layer, std::move(weight), std::move(act)));
    return;
  }
  auto& observed = static_cast<detail::ObservedForm<Layer>&>(*layer.form());
  act.input = qparams_of(observed.input_observer());
  act.output = qparams_of(observed.output_observer());
  act.relu = observed.relu();
  Int8Weight weight = quantize_flat(layer);
  std::unique_ptr<nn::LayerForm<Layer>> old = layer.take_form();
  layer.set_form("quantized", int8_form(layer, std::move(weight), std::move(act)));
}

// Every layer's form, made (make(l, layer) -> std::unique_ptr<LayerForm<Layer>>) before the first
// is set, so that a factory or form that raises leaves the model unchanged.
template <class Make>
std::vector<std::unique_ptr<nn::Module>> make_forms(const std::vector<detail::QuantLayer>& layers, Make&& make) {
  std::vector<std::unique_ptr<nn::Module>> forms;
  for (const auto& l : layers) visit(l, [&](auto& layer) { forms.push_back(make(l, layer)); });
  return forms;
}

// Sets forms[i] (of make_forms) on layers[i] under `name`.
void set_forms(const std::vector<detail::QuantLayer>& layers, std::vector<std::unique_ptr<nn::Module>> forms,
               const std::string& name) {
  for (size_t i = 0; i < layers.size(); ++i)
    visit(layers[i], [&](auto& layer) {
      using Form = nn::LayerForm<LayerOf<decltype(layer)>>;
      layer.set_form(name, std::unique_ptr<Form>(static_cast<Form*>(forms[i].release())));
    });
}

}  // namespace

int64_t prepare_qat(nn::Module& model, const QatOptions& o) {
  const std::vector<detail::QuantLayer> layers = detail::quant_layers(model, o.filter);
  check_unprepared(layers, "prepare_qat");
  auto forms = make_forms(layers, [&](const detail::QuantLayer& l, auto& layer) {
    using Layer = LayerOf<decltype(layer)>;
    const int64_t out = detail::out_channels(layer);
    auto input_fq = o.input_fake_quant ? o.input_fake_quant() : default_fake_quant();
    auto weight_fq = o.weight_fake_quant ? o.weight_fake_quant(out) : default_weight_fake_quant(out);
    const nn::BatchNormBase* bn =
        l.fused && l.fused->has_batch_norm() ? dynamic_cast<const nn::BatchNormBase*>(&(*l.fused)[1]) : nullptr;
    return std::make_unique<detail::QatForm<Layer>>(std::move(input_fq), std::move(weight_fq), bn);
  });
  // the stubs' fake quants made before any change, as the forms
  const auto stubs = stubs_at(model, o.filter, QuantStub::Stage::Float);
  std::vector<std::unique_ptr<FakeQuantize>> stub_fqs;
  for (size_t i = 0; i < stubs.size(); ++i)
    stub_fqs.push_back(o.input_fake_quant ? o.input_fake_quant() : default_fake_quant());
  // checked here, as set_fake_quant would, since the layers take what a stub refuses
  for (size_t i = 0; i < stubs.size(); ++i)
    STRATA_CHECK(stub_fqs[i] != nullptr && !stub_fqs[i]->per_channel(), "[prepare_qat] QuantStub \"{}\" needs a "
                 "per-tensor fake quant (options.input_fake_quant)", stubs[i].first);
  set_forms(layers, std::move(forms), "qat");
  for (size_t i = 0; i < stubs.size(); ++i) stubs[i].second->set_fake_quant(std::move(stub_fqs[i]));
  return static_cast<int64_t>(layers.size() + stubs.size());
}

int64_t prepare(nn::Module& model, const StaticOptions& o) {
  const std::vector<detail::QuantLayer> layers = detail::quant_layers(model, o.filter);
  const auto stubs = stubs_at(model, o.filter, QuantStub::Stage::Float);
  STRATA_CHECK(!layers.empty() || !stubs.empty(), "[prepare] {} holds no nn::Linear, Conv2d, Conv1d or "
               "ConvTranspose2d (nor QuantStub) to quantize", model.name());
  check_unprepared(layers, "prepare");
  for (const auto& l : layers)
    STRATA_CHECK(!l.fused || !l.fused->has_batch_norm(), "[prepare] \"{}\" is a {} of fuse_modules_qat: static "
                 "quantization needs batch norm folded (fuse_modules in eval mode), or use prepare_qat", l.name,
                 l.fused->name());
  const auto observer = [&] {
    return o.activation_observer ? o.activation_observer() : std::make_unique<MinMaxObserver>(ObserverOptions{});
  };
  const auto fused_relu = [](const detail::QuantLayer& l) { return l.fused && l.fused->has_relu(); };
  auto forms = make_forms(layers, [&](const detail::QuantLayer& l, auto& layer) {
    using Layer = LayerOf<decltype(layer)>;
    return std::make_unique<detail::ObservedForm<Layer>>(observer(), observer(), fused_relu(l));
  });
  // the forms apply the fused ReLUs, so that the output observers see their results
  for (const auto& l : layers)
    if (fused_relu(l)) l.fused->set_submodule("1", std::make_unique<nn::Identity>());
  std::vector<std::unique_ptr<Observer>> stub_observers;
  for (size_t i = 0; i < stubs.size(); ++i) stub_observers.push_back(observer());
  set_forms(layers, std::move(forms), "observed");
  for (size_t i = 0; i < stubs.size(); ++i) stubs[i].second->set_observer(std::move(stub_observers[i]));
  return static_cast<int64_t>(layers.size() + stubs.size());
}

namespace {

// f(m) for every M at or under `module`.
template <class M, class F>
void for_each_of(nn::Module& module, F&& f) {
  for (auto& [name, m] : module.named_modules())
    if (auto* typed = dynamic_cast<M*>(m)) f(*typed);
}

}  // namespace

void enable_observer(nn::Module& module) {
  for_each_of<FakeQuantize>(module, [](FakeQuantize& fq) { fq.enable_observer(); });
}
void disable_observer(nn::Module& module) {
  for_each_of<FakeQuantize>(module, [](FakeQuantize& fq) { fq.disable_observer(); });
}
void enable_fake_quant(nn::Module& module) {
  for_each_of<FakeQuantize>(module, [](FakeQuantize& fq) { fq.enable_fake_quant(); });
}
void disable_fake_quant(nn::Module& module) {
  for_each_of<FakeQuantize>(module, [](FakeQuantize& fq) { fq.disable_fake_quant(); });
}
void freeze_bn_stats(nn::Module& module) {
  for_each_of<FusedModule>(module, [](FusedModule& f) { f.freeze_bn_stats(); });
}
void update_bn_stats(nn::Module& module) {
  for_each_of<FusedModule>(module, [](FusedModule& f) { f.update_bn_stats(); });
}

int64_t convert(nn::Module& model) {
  std::vector<detail::QuantLayer> prepared;
  for (const auto& l : detail::quant_layers(model, nullptr)) {
    visit(l, [&](auto& layer) {
      using Layer = LayerOf<decltype(layer)>;
      if (auto* qat = dynamic_cast<detail::QatForm<Layer>*>(layer.form())) {
        check_qat(l, qat->weight_fake_quant(), qat->input_fake_quant());
        prepared.push_back(l);
      } else if (auto* observed = dynamic_cast<detail::ObservedForm<Layer>*>(layer.form())) {
        STRATA_CHECK(calibrated(observed->input_observer()) && calibrated(observed->output_observer()),
                     "[convert] the observers of layer \"{}\" have seen no data: run calibration batches through the "
                     "model after quant::prepare", l.name);
        prepared.push_back(l);
      }
    });
  }
  auto stubs = stubs_at(model, nullptr, QuantStub::Stage::Observing);
  for (auto& stub : stubs_at(model, nullptr, QuantStub::Stage::FakeQuantizing)) stubs.push_back(stub);
  for (const auto& [name, stub] : stubs)
    STRATA_CHECK(stub->convertible(), "[convert] the observer of QuantStub \"{}\" has seen no data: run calibration "
                 "batches through the model after quant::prepare", name);
  STRATA_CHECK(!prepared.empty() || !stubs.empty(), "[convert] no layer or QuantStub of {} is prepared: call "
               "quant::prepare (then calibrate) or quant::prepare_qat first", model.name());
  for (const auto& l : prepared) visit(l, [&](auto& layer) { convert_layer(layer, l); });
  for (const auto& [name, stub] : stubs) stub->convert();
  return static_cast<int64_t>(prepared.size() + stubs.size());
}

}  // namespace strata::quant
