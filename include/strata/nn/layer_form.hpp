// Note [Linear forms] (and Conv2d's): how a layer computes its forward when not from its float
// weight: quantized weights (quant::quantize_dynamic, quant::convert), fake-quantized ones
// (quant::prepare_qat) or observed ones (quant::prepare). Layers are often data members of their
// parent (Note [Member children]), so a layer cannot be replaced in place by one of another type;
// the layer keeps its identity and name and hands its forward to a form, a child module whose
// parameters and buffers enter the state dict under "<layer>.<form name>.". A form that replaces
// the weight removes "weight" from the layer, releasing its memory.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <strata/core/error.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

template <class Layer>
class LayerForm : public Module {
 public:
  /// The layer's forward (its input checked already), with the layer's configuration and bias.
  virtual Tensor forward_layer(const Layer& layer, const Tensor& input) = 0;
  /// Whether the form holds the weight itself (then the layer's float weight is dropped).
  virtual bool replaces_weight() const = 0;
};

/// The form a layer holds as a child; Layer befriends FormSlot<Layer>, which registers the form
/// and drops the weight through Layer's protected Module calls. Form is the base of the layer's
/// forms (LayerForm<Layer>, or one whose forward takes more inputs, as EmbeddingBagForm).
template <class Layer, class Form = LayerForm<Layer>>
class FormSlot {
 public:
  Form* get() const { return form_; }

  Form& set(Layer& layer, std::string name, std::unique_ptr<Form> form) {
    STRATA_CHECK(form != nullptr, "[{}] the form is null", layer.name());
    STRATA_CHECK(form_ == nullptr, "[{}] already has the form \"{}\" ({}); a layer takes one form", layer.name(),
                 name_, form_ ? form_->name() : "");
    const bool drop_weight = form->replaces_weight();
    form_ = &layer.register_module(name, std::move(form));
    name_ = std::move(name);
    if (drop_weight) {
      layer.unregister("weight");
      layer.weight = Tensor();
    }
    return *form_;
  }

  std::unique_ptr<Form> take(Layer& layer) {
    if (!form_) return nullptr;
    STRATA_CHECK(layer.weight.defined(), "[{}] the form \"{}\" replaced the float weight and cannot be taken off",
                 layer.name(), name_);
    std::unique_ptr<Module> owned = layer.unregister(name_);
    form_ = nullptr;
    name_.clear();
    return std::unique_ptr<Form>(static_cast<Form*>(owned.release()));
  }

  /// For Module::replacing_child: the form is replaced through set and take only.
  void check_not_form(const Module* child, const std::string& layer) const {
    STRATA_CHECK(child == nullptr || child != form_, "[{}] its form \"{}\" is replaced through set_form and "
                 "take_form, not set_submodule", layer, name_);
  }
  const std::string& name() const { return name_; }

 private:
  Form* form_ = nullptr;  // owned by the layer as a child
  std::string name_;
};

}  // namespace strata::nn
