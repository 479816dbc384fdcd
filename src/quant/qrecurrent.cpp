// Dynamic quantization of the recurrent layers and cells (quantize_dynamic's `recurrent` option):
// a form (Note [Recurrent forms] in nn/recurrent.hpp) holding every weight of the layer as int8
// codes per output channel, whose products quantize each step's activations per row and run the
// dynamic int8 Linear's GEMM (forms.h int8_dynamic), or as float16 weights multiplied in the
// activations' dtype. The layer keeps its gate math, its loop and its float biases.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/recurrent.hpp>
#include <strata/quant/quantize.hpp>

#include "kernels/cpu/qgemm.h"
#include "quant/forms.h"
#include "quant/qrecurrent.h"

namespace strata::quant::detail {

namespace {

// One weight of a recurrent layer: layer and direction k, which, its parameter name and value.
struct NamedWeight {
  int64_t k;
  nn::RecurrentWeight which;
  std::string name;
  Tensor weight;
};

std::vector<NamedWeight> weights_of(const nn::Module& m) {
  std::vector<NamedWeight> out;
  if (const auto* rnn = dynamic_cast<const nn::RNNBase*>(&m)) {
    for (int64_t k = 0; k < static_cast<int64_t>(rnn->all_weights.size()); ++k) {
      const nn::RecurrentWeights& w = rnn->all_weights[static_cast<size_t>(k)];
      out.push_back({k, nn::RecurrentWeight::InputHidden, rnn->weight_name(k, nn::RecurrentWeight::InputHidden),
                     w.weight_ih});
      out.push_back({k, nn::RecurrentWeight::HiddenHidden, rnn->weight_name(k, nn::RecurrentWeight::HiddenHidden),
                     w.weight_hh});
      if (w.weight_hr.defined())
        out.push_back({k, nn::RecurrentWeight::Projection, rnn->weight_name(k, nn::RecurrentWeight::Projection),
                       w.weight_hr});
    }
  } else if (const auto* cell = dynamic_cast<const nn::RNNCellBase*>(&m)) {
    out.push_back({0, nn::RecurrentWeight::InputHidden, "weight_ih", cell->weight_ih});
    out.push_back({0, nn::RecurrentWeight::HiddenHidden, "weight_hh", cell->weight_hh});
  }
  return out;
}

// int8 codes and scales per output channel (buffers "<weight>_int8", "<weight>_scale"), or the
// float16 weight ("<weight>_fp16").
class DynamicRecurrentForm : public nn::RecurrentForm {
 public:
  DynamicRecurrentForm(RecurrentDtype dtype, const std::vector<NamedWeight>& weights) : dtype_(dtype) {
    NoGradGuard no_grad;
    for (const NamedWeight& w : weights) {
      Slot& s = slots_[{w.k, static_cast<int>(w.which)}];
      if (dtype == RecurrentDtype::Int8) {
        Int8Weight q = quantize_weight_int8(w.weight);
        s.int8.codes = register_buffer(w.name + "_int8", q.codes);
        s.int8.scale = register_buffer(w.name + "_scale", q.scale);
        s.row_sums = std::make_unique<CodesCache>();
      } else {
        s.fp16 = register_buffer(w.name + "_fp16", to_float16_weight(w.weight));
      }
    }
  }

  Tensor project(int64_t k, nn::RecurrentWeight which, const Tensor& x, const Tensor& bias) override {
    auto it = slots_.find({k, static_cast<int>(which)});
    STRATA_CHECK(it != slots_.end(), "[{}] holds no weight {} of layer and direction {}", name(),
                 static_cast<int>(which), k);
    Slot& s = it->second;
    if (dtype_ == RecurrentDtype::Int8)
      return int8_dynamic(x, s.int8, s.row_sums->of(s.int8.codes, row_sums), bias, "recurrent(int8)");
    return float16_product(x, s.fp16, bias);  // float16 storage, float32 product (as fbgemm's fp16 GEMM)
  }

  void check_inputs(const std::string& layer, const std::vector<Tensor>& inputs) const override {
    if (!autograd::is_grad_enabled()) return;
    for (const Tensor& t : inputs)
      STRATA_CHECK(!t.defined() || !t.requires_grad(),
                   "[{}] is quantized ({}) and computes without autograd: its input and states must not require "
                   "grad (run it under NoGradGuard, or detach them)", layer, name());
  }

  std::string name() const override {
    return dtype_ == RecurrentDtype::Int8 ? "Int8RecurrentForm" : "Float16RecurrentForm";
  }

 private:
  struct Slot {
    Int8Weight int8;
    Tensor fp16;
    std::unique_ptr<CodesCache> row_sums;  // of int8.codes, derived again when they change
  };
  RecurrentDtype dtype_;
  std::map<std::pair<int64_t, int>, Slot> slots_;
};

}  // namespace

std::vector<RecurrentConversion> recurrent_conversions(nn::Module& model, const QuantizeOptions& o) {
  const char* op = "quantize_dynamic";
  STRATA_CHECK(o.recurrent == RecurrentDtype::None || o.recurrent == RecurrentDtype::Int8 ||
                   o.recurrent == RecurrentDtype::Float16,
               "[{}] unknown recurrent dtype {}", op, static_cast<int>(o.recurrent));
  std::vector<RecurrentConversion> out;
  if (o.recurrent == RecurrentDtype::None) return out;
  for (auto& [name, m] : model.named_modules()) {
    auto* rnn = dynamic_cast<nn::RNNBase*>(m);
    auto* cell = dynamic_cast<nn::RNNCellBase*>(m);
    if ((!rnn && !cell) || (o.recurrent_filter && !o.recurrent_filter(name, *m))) continue;
    const nn::RecurrentForm* form = rnn ? rnn->form() : cell->form();
    STRATA_CHECK(form == nullptr, "[{}] layer \"{}\" is quantized already ({})", op, name, form ? form->name() : "");
    const std::vector<NamedWeight> weights = weights_of(*m);
    for (const NamedWeight& w : weights)
      STRATA_CHECK(o.recurrent != RecurrentDtype::Int8 || w.weight.size(1) <= cpu::quant::kMaxUint8K,
                   "[{}] layer \"{}\" has {} of {} columns > {}, past which int8 sums could overflow", op, name,
                   w.name, w.weight.size(1), cpu::quant::kMaxUint8K);
    out.push_back({m, std::make_unique<DynamicRecurrentForm>(o.recurrent, weights)});
  }
  return out;
}

void apply_conversion(RecurrentConversion& c) {
  if (auto* rnn = dynamic_cast<nn::RNNBase*>(c.layer)) {
    rnn->set_form("quantized", std::move(c.form));
  } else {
    static_cast<nn::RNNCellBase*>(c.layer)->set_form("quantized", std::move(c.form));
  }
}

}  // namespace strata::quant::detail
