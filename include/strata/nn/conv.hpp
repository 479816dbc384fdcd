// Convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d, with PyTorch's
// parameter names, shapes and default initialization (weight kaiming_uniform(a = sqrt(5)), bias
// uniform(+-1/sqrt(fan_in))), so state_dict keys and shapes match torch's.
//
//   nn::Conv2d conv(3, 64, 3, {.stride = 2, .padding = 1, .bias = false});
//   Tensor y = conv(x);  // x (N, 3, H, W), NCHW or channels-last; y in x's memory format
#pragma once

#include <cstdint>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/nn/functional_resample.hpp>
#include <strata/nn/layer_form.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

/// How a convolution pads its input: Zeros inside the convolution, the others through
/// functional::pad first (as torch.nn's padding_mode). Transposed convolutions take Zeros only.
enum class PaddingMode : uint8_t { Zeros, Reflect, Replicate, Circular };

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;  // for the initial values; default_generator() when null
};

class Conv2d;
/// See Note [Linear forms] in nn/layer_form.hpp: quantized and fake-quantized convolutions.
using Conv2dForm = LayerForm<Conv2d>;

class STRATA_API Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Conv2dOptions options = {});
  /// (N, in_channels, H, W) or (in_channels, H, W) -> (N, out_channels, H', W'); raises Error
  /// naming the layer when the input's rank or channel count does not fit.
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Conv2d"; }
  /// Re-draws the parameters as the constructor does.
  void reset_parameters(Generator* gen = nullptr);

  /// Hands the forward to `form`, registered as the child `name` (Note [Linear forms]); raises
  /// when the layer has a form already.
  Conv2dForm& set_form(std::string name, std::unique_ptr<Conv2dForm> form);
  /// Removes the form and returns it (null without one); raises when the form replaced the weight.
  std::unique_ptr<Conv2dForm> take_form();
  Conv2dForm* form() const { return form_.get(); }

  int64_t in_channels, out_channels;
  Size2 kernel_size;
  Conv2dOptions options;
  Tensor weight;  // (out_channels, in_channels / groups, kH, kW); undefined once a form replaced it
  Tensor bias;    // (out_channels), undefined without bias

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<Conv2d>;
  FormSlot<Conv2d> form_;
};

struct ConvTranspose2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;
};

class ConvTranspose2d;
using ConvTranspose2dForm = LayerForm<ConvTranspose2d>;  // quantized forms (Note [Linear forms])

class STRATA_API ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, ConvTranspose2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ConvTranspose2d"; }
  void reset_parameters(Generator* gen = nullptr);
  /// As Conv2d's.
  ConvTranspose2dForm& set_form(std::string name, std::unique_ptr<ConvTranspose2dForm> form);
  std::unique_ptr<ConvTranspose2dForm> take_form();
  ConvTranspose2dForm* form() const { return form_.get(); }

  int64_t in_channels, out_channels;
  Size2 kernel_size;
  ConvTranspose2dOptions options;
  Tensor weight;  // (in_channels, out_channels / groups, kH, kW); undefined once a form replaced it
  Tensor bias;    // (out_channels), undefined without bias

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<ConvTranspose2d>;
  FormSlot<ConvTranspose2d> form_;
};

struct Conv1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;
};

class Conv1d;
using Conv1dForm = LayerForm<Conv1d>;  // quantized forms (Note [Linear forms])

class STRATA_API Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv1dOptions options = {});
  /// (N, in_channels, L) or (in_channels, L) -> (N, out_channels, L').
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Conv1d"; }
  void reset_parameters(Generator* gen = nullptr);
  /// As Conv2d's.
  Conv1dForm& set_form(std::string name, std::unique_ptr<Conv1dForm> form);
  std::unique_ptr<Conv1dForm> take_form();
  Conv1dForm* form() const { return form_.get(); }

  int64_t in_channels, out_channels, kernel_size;
  Conv1dOptions options;
  Tensor weight;  // (out_channels, in_channels / groups, kernel_size); undefined once a form replaced it
  Tensor bias;    // (out_channels), undefined without bias

 protected:
  void replacing_child(Module* old, Module* now) override { form_.check_not_form(old, name()); }

 private:
  friend class FormSlot<Conv1d>;
  FormSlot<Conv1d> form_;
};

struct ConvTranspose1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  int64_t dilation = 1;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;
};

class STRATA_API ConvTranspose1d : public Module {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, ConvTranspose1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ConvTranspose1d"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_channels, out_channels, kernel_size;
  ConvTranspose1dOptions options;
  Tensor weight;  // (in_channels, out_channels / groups, kernel_size)
  Tensor bias;    // (out_channels), undefined without bias
};

struct Conv3dOptions {
  Size3 stride = 1;
  Size3 padding = 0;
  Size3 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;
};

class STRATA_API Conv3d : public Module {
 public:
  Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Conv3dOptions options = {});
  /// (N, in_channels, D, H, W) or (in_channels, D, H, W) -> (N, out_channels, D', H', W').
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Conv3d"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_channels, out_channels;
  Size3 kernel_size;
  Conv3dOptions options;
  Tensor weight;  // (out_channels, in_channels / groups, kD, kH, kW)
  Tensor bias;    // (out_channels), undefined without bias
};

struct ConvTranspose3dOptions {
  Size3 stride = 1;
  Size3 padding = 0;
  Size3 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size3 dilation = 1;
  PaddingMode padding_mode = PaddingMode::Zeros;
  Generator* generator = nullptr;
};

class STRATA_API ConvTranspose3d : public Module {
 public:
  ConvTranspose3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, ConvTranspose3dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ConvTranspose3d"; }
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_channels, out_channels;
  Size3 kernel_size;
  ConvTranspose3dOptions options;
  Tensor weight;  // (in_channels, out_channels / groups, kD, kH, kW)
  Tensor bias;    // (out_channels), undefined without bias
};

}  // namespace strata::nn
