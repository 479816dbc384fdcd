// Linear: y = x @ weight^T + bias, with PyTorch's parameter names, shapes and default
// initialization (weight kaiming_uniform(a = sqrt(5)), bias uniform(+-1/sqrt(in_features))).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/layer_form.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct LinearOptions {
  bool bias = true;
  Generator* generator = nullptr;  // for the initial values; default_generator() when null
};

class Linear;
/// See Note [Linear forms] in nn/layer_form.hpp.
using LinearForm = LayerForm<Linear>;

class STRATA_API Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  /// (*, in_features) -> (*, out_features); raises Error naming the layer when the last dim
  /// of the input is not in_features.
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Linear"; }
  /// Re-draws the parameters as the constructor does.
  void reset_parameters(Generator* gen = nullptr);

  /// Hands the forward to `form`, registered as the child `name` (Note [Linear forms]); raises
  /// when the layer has a form already.
  LinearForm& set_form(std::string name, std::unique_ptr<LinearForm> form);
  /// Removes the form and returns it (null without one); raises when the form replaced the weight.
  std::unique_ptr<LinearForm> take_form();
  LinearForm* form() const { return form_.get(); }

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features); undefined once a form replaced it
  Tensor bias;    // (out_features), undefined without bias

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<Linear>;
  FormSlot<Linear> form_;
};

}  // namespace strata::nn
