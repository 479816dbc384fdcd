// The layer forms of the quant module (Note [Linear forms] in nn/layer_form.hpp): int8 and int4
// weights, which replace the float weight; fake quantization for QAT and observers for static
// quantization, which keep it. The QAT and observer forms are templates over the layer (Linear,
// Conv2d, Conv1d, ConvTranspose2d): they differ only in the float forward of layer_ops.h.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <strata/nn/batchnorm.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/linear.hpp>
#include <strata/quant/fake_quantize.hpp>
#include <strata/quant/quantize.hpp>

#include "quant/layer_ops.h"

namespace strata::quant::detail {

/// One activation's fixed quantization: scale (1) float32, zero point (1) int32, code range.
struct ActQParams {
  Tensor scale, zero_point;
  QRange range;
};

/// A static int8 layer's activations: the input's qparams, and the output's when it is requantized
/// (static quantization; QAT's converted layers give float outputs), with ReLU fused before that.
struct StaticActivations {
  ActQParams input;
  std::optional<ActQParams> output;
  bool relu = false;
};

/// Registers the qparams as buffers of `form` (input_scale, input_zero_point, output_scale,
/// output_zero_point), so they enter the state dict and move with the module.
void register_static(nn::Module& form, StaticActivations& act);
/// x float32 contiguous -> uint8 codes of its shape with the input's qparams; an int8 range runs
/// shifted by +128 into uint8 (q - zero_point is unchanged). *zero: the shifted zero point (1).
Tensor quantize_static_input(const Tensor& x, const ActQParams& in, Tensor* zero);
/// y float32 (M, N) = the int8 product of uint8 codes (M, K) and the weight (kernels/cpu/qgemm.h).
Tensor int8_product(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool per_row, const Int8Weight& w,
                    const Tensor& w_row_sum, const Tensor& bias);
/// y = x (*, K) . dequantize(w)^T + bias with x's rows quantized to uint8 each with its own range
/// (the dynamic int8 Linear); w_row_sum = row_sums(w.codes). No autograd; output of x's dtype.
Tensor int8_dynamic(const Tensor& x, const Int8Weight& w, const Tensor& w_row_sum, const Tensor& bias, const char* op);
/// The int32 sums of each weight row's codes (N), which the zero-point correction reads.
Tensor row_sums(const Tensor& codes);
/// y float32 (rows of x, N): x's rows quantized with the fixed input qparams `in`, times the weight.
Tensor int8_static_product(const Tensor& x, const ActQParams& in, const Int8Weight& w, const Tensor& w_row_sum,
                           const Tensor& bias, const char* op);
/// ReLU (when fused) and requantization to the output's qparams (when given), as float values.
Tensor finish_static(const Tensor& y, const StaticActivations& act);
/// A floating bias of shape (N) on `device` in `dtype`, or undefined.
Tensor bias_of(const Tensor& bias, int64_t N, const Device& device, DType dtype, const char* op);
void check_int8_weight(const Int8Weight& w, const char* op);
/// A uint8 input's qparams, checked (the functional forms).
ActQParams act_qparams(double scale, int64_t zero_point, const Device& device, const char* op);
/// A tensor derived from a weight's codes (their row sums, their im2col layout), computed again
/// when the codes change (a load_state_dict writes them; Module::to or set_tensor gives them new
/// memory), under a lock (threads may share a model for inference).
class CodesCache {
 public:
  Tensor of(const Tensor& codes, const std::function<Tensor(const Tensor&)>& derive);

 private:
  std::mutex mutex_;
  Tensor value_;
  std::weak_ptr<Storage> storage_;  // the codes' memory and version value_ was derived at
  int64_t version_ = -1;
};

/// y float32 (N, out, OH, OW), a channels-last view, of the int8 convolution of uint8 codes (N, H, W,
/// C), taps outside the image reading `pad` (the zero point); w.codes (out, C / groups * kH * kW);
/// finished (ReLU, requantization) per `act` when given. The im2col path lays the weight out as its
/// columns, (out, kH * kW * C / groups), kept in `layout` when given (a layer's form).
Tensor conv2d_codes(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, uint8_t pad,
                    const Int8Weight& w, const Tensor& w_row_sum, const Tensor& bias, nn::Size2 kernel,
                    const nn::functional::Conv2dArgs& args, const StaticActivations* act, CodesCache* layout = nullptr);

/// int8 weights; activations quantized per row at run time (dynamic), or with fixed qparams
/// (static) when given. Buffers: weight_int8, weight_scale; static also those of register_static.
class Int8LinearForm : public nn::LinearForm {
 public:
  Int8LinearForm(Int8Weight weight, std::optional<StaticActivations> act);
  Tensor forward_layer(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Int8LinearForm"; }

 private:
  Int8Weight weight_;
  std::optional<StaticActivations> act_;
  CodesCache row_sums_;
};

/// x (N, C, H, W) float -> uint8 codes (N, H, W, C) contiguous with the input's qparams (*zero as
/// quantize_static_input's); a channels-last input is quantized as it lies.
Tensor nhwc_codes(const Tensor& x, const ActQParams& in, Tensor* zero);
/// y (N, C, H, W) (a channels-last view) in x's memory format, without the batch dim when x had none.
Tensor like_input(const Tensor& y, const Tensor& x);
/// The int8 transposed convolution of x (N, C, H, W) or (C, H, W) (Int8ConvTranspose2dForm), float32 in
/// x's memory format, finished per act when given; the GEMM's weight layout and its row sums kept in
/// the caches when given.
Tensor conv_transpose2d_codes(const Tensor& x, const ActQParams& in, const Int8Weight& w, const Tensor& bias,
                              nn::Size2 kernel, const nn::functional::ConvTranspose2dArgs& args,
                              const StaticActivations* act, CodesCache* layout, CodesCache* sums, const char* op);

/// The weight's and activations' buffers of a static int8 layer: weight_int8, weight_scale and those
/// of register_static.
void register_int8(nn::Module& form, Int8Weight& weight, StaticActivations& act);

/// conv2d_int8 of a form: x (N, C, H, W) or (C, H, W) -> float32 in x's memory format, finished per act.
Tensor int8_conv2d_layer(const Tensor& x, const Int8Weight& w, const StaticActivations& act, const Tensor& bias,
                         const Conv2dGeometry& geometry, CodesCache& row_sums, CodesCache& layout);

/// A static int8 convolution (Conv2d, or Conv1d as a Conv2d of height 1): the input quantized with
/// fixed qparams, the int8 convolution of its codes (conv2d_codes). Buffers: weight_int8 (out, in /
/// groups * kernel elements), weight_scale and those of register_static.
template <class Conv>
class Int8ConvForm : public nn::LayerForm<Conv> {
 public:
  Int8ConvForm(Int8Weight weight, StaticActivations act) : weight_(std::move(weight)), act_(std::move(act)) {
    register_int8(*this, weight_, act_);
  }
  Tensor forward_layer(const Conv& layer, const Tensor& input) override {
    const Conv2dGeometry g = as_conv2d(layer);
    const Tensor y = int8_conv2d_layer(g.one_d ? input.unsqueeze(-2) : input, weight_, act_, layer.bias, g,
                                       row_sums_, im2col_layout_);
    return (g.one_d ? y.squeeze(-2) : y).to(input.dtype());
  }
  bool replaces_weight() const override { return true; }
  std::string name() const override { return std::string("Int8") + layer_name(static_cast<Conv*>(nullptr)) + "Form"; }

 private:
  Int8Weight weight_;
  StaticActivations act_;
  CodesCache row_sums_, im2col_layout_;
};
using Int8Conv2dForm = Int8ConvForm<nn::Conv2d>;
using Int8Conv1dForm = Int8ConvForm<nn::Conv1d>;

/// A static int8 transposed convolution: the input's codes times the weight's in the int8 GEMM (one
/// column per output channel and kernel tap), the float columns summed into the output (col2im) with
/// the bias, finished per act. Buffers: weight_int8 (out, in / groups * kH * kW) (the weight as
/// out_major lays it out), weight_scale (out) and those of register_static (src/quant/qconv_transpose.cpp).
class Int8ConvTranspose2dForm : public nn::ConvTranspose2dForm {
 public:
  Int8ConvTranspose2dForm(Int8Weight weight, StaticActivations act);
  Tensor forward_layer(const nn::ConvTranspose2d& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Int8ConvTranspose2dForm"; }

 private:
  Int8Weight weight_;
  StaticActivations act_;
  CodesCache gemm_layout_, row_sums_;
};

/// int4 weight only. Buffers: weight_int4, weight_scale, weight_zero_point (asymmetric).
class Int4LinearForm : public nn::LinearForm {
 public:
  explicit Int4LinearForm(Int4Weight weight);
  Tensor forward_layer(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Int4LinearForm"; }

 private:
  Int4Weight weight_;
};

/// w as float16, saturated to float16's finite range (fbgemm's fp16 packing).
Tensor to_float16_weight(const Tensor& w);
/// x . w16^T + bias computed in float32 (float64 for a float64 x), output of x's dtype; no autograd.
Tensor float16_product(const Tensor& x, const Tensor& w16, const Tensor& bias);

/// float16 weight, float32 product (quantize_dynamic's WeightDtype::Float16). Buffer: weight_fp16.
class Float16LinearForm : public nn::LinearForm {
 public:
  explicit Float16LinearForm(const Tensor& weight);
  Tensor forward_layer(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Float16LinearForm"; }

 private:
  Tensor weight_;
};

/// The row-wise quantized form of an embedding layer's weight (8 or 4 bits; src/quant/qembedding.cpp).
std::unique_ptr<nn::EmbeddingForm> rowwise_form(const nn::Embedding& layer, int bits);
std::unique_ptr<nn::EmbeddingBagForm> rowwise_form(const nn::EmbeddingBag& layer, int bits);

/// For Module::replacing_child of a form that keeps a pointer to its child `kept`: when set_submodule
/// replaces that child, the pointer follows the new one, which must be a T, named `type` (a stale
/// pointer would outlive the old child, which the caller owns and may drop).
template <class T>
void follow_child(T*& kept, nn::Module* old, nn::Module* now, const nn::Module& form, const char* child,
                  const char* type) {
  if (old == nullptr || old != kept) return;
  T* typed = dynamic_cast<T*>(now);
  STRATA_CHECK(typed != nullptr, "[{}] \"{}\" must be replaced by a {}, got {}", form.name(), child, type,
               now ? now->name() : "null");
  kept = typed;
}

/// QAT: the layer's float forward of input_fake_quant(x) and weight_fake_quant(weight), training
/// the float weight. Before a batch norm (the fused modules of fuse_modules_qat), as PyTorch's
/// ConvBn2d: the weight is scaled by gamma / sqrt(running_var + eps) before its fake quant, so it
/// trains the rounding of the weight convert folds, and the product is scaled back (bias added
/// after) for the batch norm that follows.
template <class Layer>
class QatForm : public nn::LayerForm<Layer> {
 public:
  QatForm(std::unique_ptr<FakeQuantize> input_fq, std::unique_ptr<FakeQuantize> weight_fq,
          const nn::BatchNormBase* bn = nullptr)
      : bn_(bn) {
    STRATA_CHECK(input_fq && weight_fq, "[prepare_qat] a fake quant factory returned null");
    input_fq_ = &this->register_module("input_fake_quant", std::move(input_fq));
    weight_fq_ = &this->register_module("weight_fake_quant", std::move(weight_fq));
  }
  Tensor forward_layer(const Layer& layer, const Tensor& input) override {
    // the fake quant sees the weight with its output channels on dim 0 (out_major)
    const auto fake_quant = [&](const Tensor& w) { return from_out_major(layer, (*weight_fq_)(out_major(layer, w))); };
    if (!bn_) return float_forward(layer, (*input_fq_)(input), fake_quant(layer.weight));
    const Tensor s = bn_scale(*bn_, layer.weight);
    const Tensor w = fake_quant(layer.weight * s.reshape(per_channel_shape(layer.weight.dim(), 0, s.numel())));
    Tensor y = float_forward(layer, (*input_fq_)(input), w, Tensor());
    const Shape channels = per_channel_shape(y.dim(), output_channel_dim(layer, y.dim()), s.numel());
    y = y / s.reshape(channels);
    return layer.bias.defined() ? y + layer.bias.reshape(channels) : y;
  }
  bool replaces_weight() const override { return false; }
  std::string name() const override { return std::string("Qat") + layer_name(static_cast<Layer*>(nullptr)) + "Form"; }
  FakeQuantize& input_fake_quant() { return *input_fq_; }
  FakeQuantize& weight_fake_quant() { return *weight_fq_; }
  const nn::BatchNormBase* batch_norm() const { return bn_; }

 protected:
  void replacing_child(nn::Module* old, nn::Module* now) override {
    follow_child(input_fq_, old, now, *this, "input_fake_quant", "FakeQuantize");
    follow_child(weight_fq_, old, now, *this, "weight_fake_quant", "FakeQuantize");
  }

 private:
  FakeQuantize* input_fq_;
  FakeQuantize* weight_fq_;
  const nn::BatchNormBase* bn_;  // the fused module's batch norm, a sibling of the layer
};

/// Static quantization's calibration: observers of the input and of the output (after the fused
/// ReLU, which this form then applies), around the float forward.
template <class Layer>
class ObservedForm : public nn::LayerForm<Layer> {
 public:
  ObservedForm(std::unique_ptr<Observer> input, std::unique_ptr<Observer> output, bool relu) : relu_(relu) {
    STRATA_CHECK(input && output, "[prepare] the observer factory returned null");
    STRATA_CHECK(!input->per_channel() && !output->per_channel(), "[prepare] activation observers must be per tensor");
    input_ = &this->register_module("input_observer", std::move(input));
    output_ = &this->register_module("output_observer", std::move(output));
  }
  Tensor forward_layer(const Layer& layer, const Tensor& input) override {
    Tensor y = float_forward(layer, (*input_)(input), layer.weight);
    if (relu_) y = nn::functional::relu(y);
    return (*output_)(y);
  }
  bool replaces_weight() const override { return false; }
  std::string name() const override {
    return std::string("Observed") + layer_name(static_cast<Layer*>(nullptr)) + "Form";
  }
  Observer& input_observer() { return *input_; }
  Observer& output_observer() { return *output_; }
  bool relu() const { return relu_; }

 protected:
  void replacing_child(nn::Module* old, nn::Module* now) override {
    const auto* observer = dynamic_cast<const Observer*>(now);
    STRATA_CHECK(!(old == input_ || old == output_) || !observer || !observer->per_channel(),
                 "[{}] activation observers must be per tensor", this->name());
    follow_child(input_, old, now, *this, "input_observer", "quant::Observer");
    follow_child(output_, old, now, *this, "output_observer", "quant::Observer");
  }

 private:
  Observer* input_;
  Observer* output_;
  bool relu_;
};

}  // namespace strata::quant::detail
