// The LinearForms of the quant module (Note [Linear forms] in nn/linear.hpp): int8 and int4
// weights, which replace the float weight, and fake quantization for QAT, which keeps it.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <strata/nn/linear.hpp>
#include <strata/quant/fake_quantize.hpp>
#include <strata/quant/quantize.hpp>

namespace strata::quant::detail {

/// int8 weights; activations quantized per row at run time (dynamic), or with one fixed scale and
/// zero point (static, from a QAT observer) when StaticInput is given. Buffers: weight_int8,
/// weight_scale; static also input_scale (1) and input_zero_point (1).
class Int8LinearForm : public nn::LinearForm {
 public:
  struct StaticInput {
    Tensor scale, zero_point;  // (1) float32, (1) int32
    QRange range;              // the observer's code range (int8 ranges are run shifted to uint8)
  };
  Int8LinearForm(Int8Weight weight, std::optional<StaticInput> input);
  Tensor forward_linear(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Int8LinearForm"; }

 private:
  Int8Weight weight_;
  std::optional<StaticInput> input_;
  /// The sum of each weight row's codes, int32 (out), for the activations' zero points; computed
  /// again when the codes change (a load_state_dict writes them; Module::to or set_tensor gives
  /// them new memory), under a lock (threads may share a model for inference).
  Tensor row_sums();
  std::mutex row_sum_mutex_;
  Tensor row_sum_;
  std::weak_ptr<Storage> row_sum_storage_;  // the codes' memory and version row_sum_ was computed at
  int64_t row_sum_version_ = -1;
};

/// int4 weight only. Buffers: weight_int4, weight_scale, weight_zero_point (asymmetric).
class Int4LinearForm : public nn::LinearForm {
 public:
  explicit Int4LinearForm(Int4Weight weight);
  Tensor forward_linear(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "Int4LinearForm"; }

 private:
  Int4Weight weight_;
};

/// QAT: linear(input_fake_quant(x), weight_fake_quant(weight), bias), training the float weight.
class QatLinearForm : public nn::LinearForm {
 public:
  QatLinearForm(std::unique_ptr<FakeQuantize> input_fq, std::unique_ptr<FakeQuantize> weight_fq);
  Tensor forward_linear(const nn::Linear& layer, const Tensor& input) override;
  bool replaces_weight() const override { return false; }
  std::string name() const override { return "QatLinearForm"; }
  FakeQuantize& input_fake_quant() { return *input_fq_; }
  FakeQuantize& weight_fake_quant() { return *weight_fq_; }

 private:
  FakeQuantize* input_fq_;
  FakeQuantize* weight_fq_;
};

}  // namespace strata::quant::detail
