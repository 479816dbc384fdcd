// Eager-mode quantization stubs (torch.ao.quantization.QuantStub, DeQuantStub, QuantWrapper): a
// model marks where its quantized region begins and ends. prepare() puts an observer on each
// QuantStub (prepare_qat a fake quant); convert() turns it into a quantize with the observed scale
// and zero point. See docs/quantization.md, "Quantization stubs".
//
//   struct Net : nn::Module { QuantStub quant; nn::Linear fc{4, 8}; DeQuantStub dequant; ... };
//   Tensor forward(const Tensor& x) override { return dequant(fc(quant(x))); }
//
// strata's quantized layers take and return float tensors holding the dequantized values (there is
// no quantized tensor type flowing between modules), so a converted QuantStub returns
// dequantize(quantize(x)) (x rounded to its quantization grid and clamped, float, not
// differentiable) and a DeQuantStub is the identity at every stage. The first quantized layer after
// a QuantStub quantizes that output again with its own input observer's qparams, which saw the same
// calibration data: the codes are the stub's, exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/nn/module.hpp>
#include <strata/quant/fake_quantize.hpp>
#include <strata/quant/observer.hpp>
#include <strata/quant/qtensor.hpp>

namespace strata::quant {

/// The start of a quantized region. Float (identity) until prepared; prepared: observes its input
/// (child "activation_post_process", an Observer, or a FakeQuantize after prepare_qat, whose output
/// it returns); converted: quantizes per tensor with buffers "scale" (float32 (1)) and
/// "zero_point" (int32 (1)) to its range, and returns the dequantized values in x's dtype.
class STRATA_API QuantStub : public nn::Module {
 public:
  enum class Stage { Float, Observing, FakeQuantizing, Quantized };

  QuantStub() = default;
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "QuantStub"; }
  Stage stage() const { return stage_; }

  /// prepare(): observe with `observer`; raises unless the stub is still float.
  void set_observer(std::unique_ptr<Observer> observer);
  /// prepare_qat(): fake-quantize with `fake_quant`; raises unless the stub is still float.
  void set_fake_quant(std::unique_ptr<FakeQuantize> fake_quant);
  /// Whether convert() can take this stub: observing with data seen, or fake-quantizing.
  bool convertible() const;
  /// convert(): fixes the observer's (fake quant's) qparams and drops it; raises when not convertible.
  void convert();
  /// The fixed qparams and code range (after convert).
  double scale() const;
  int64_t zero_point() const;
  QRange range() const { return range_; }

 protected:
  /// The observer or fake quant is the stub's stage: set_submodule cannot replace it.
  void replacing_child(nn::Module* old, nn::Module* now) override;

 private:
  Stage stage_ = Stage::Float;
  Observer* observer_ = nullptr;
  FakeQuantize* fake_quant_ = nullptr;
  Tensor scale_, zero_point_;
  QRange range_{0, 255};
};

/// The end of a quantized region: the identity (its input already holds float values), kept so
/// that models written for PyTorch's eager mode port unchanged. Refuses a non-floating input.
class STRATA_API DeQuantStub : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "DeQuantStub"; }
};

/// module wrapped between a QuantStub and a DeQuantStub: forward = dequant(module(quant(x))), children
/// "quant", "dequant" and "module" (PyTorch's state dict keys).
class STRATA_API QuantWrapper : public nn::Module {
 public:
  explicit QuantWrapper(std::unique_ptr<nn::Module> module);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "QuantWrapper"; }
  QuantStub& quant() { return *quant_; }
  DeQuantStub& dequant() { return *dequant_; }
  nn::Module& module() { return *module_; }

 protected:
  void replacing_child(nn::Module* old, nn::Module* now) override;

 private:
  QuantStub* quant_;
  DeQuantStub* dequant_;
  nn::Module* module_;
};

}  // namespace strata::quant
