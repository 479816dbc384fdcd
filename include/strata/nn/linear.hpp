// Linear: y = x @ weight^T + bias, with PyTorch's parameter names, shapes and default
// initialization (weight kaiming_uniform(a = sqrt(5)), bias uniform(+-1/sqrt(in_features))).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct LinearOptions {
  bool bias = true;
  Generator* generator = nullptr;  // for the initial values; default_generator() when null
};

class Linear;

/// Note [Linear forms]
/// How a Linear computes its product when not from its float weight: quantized weights
/// (quant::quantize_dynamic) or fake-quantized ones (quant::prepare_qat). Layers are often data
/// members of their parent (Note [Member children]), so a layer cannot be replaced in place by one
/// of another type; the Linear keeps its identity and name and hands its forward to a form, a
/// child module whose parameters and buffers enter the state dict under "<layer>.<form name>.".
/// A form that replaces the weight removes "weight" from the layer, releasing its memory.
class STRATA_API LinearForm : public Module {
 public:
  /// input (*, in_features) -> (*, out_features), with the layer's bias.
  virtual Tensor forward_linear(const Linear& layer, const Tensor& input) = 0;
  /// Whether the form holds the weight itself (then the layer's float weight is dropped).
  virtual bool replaces_weight() const = 0;
};

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
  LinearForm* form() const { return form_; }

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features); undefined once a form replaced it
  Tensor bias;    // (out_features), undefined without bias

 private:
  LinearForm* form_ = nullptr;  // owned as a child
  std::string form_name_;
};

}  // namespace strata::nn
