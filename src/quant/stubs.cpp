// QuantStub, DeQuantStub and QuantWrapper: see include/strata/quant/stubs.hpp.
#include <strata/quant/stubs.hpp>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>

#include "quant/stubs.h"

namespace strata::quant {

bool detail::calibrated(const Observer& o) {
  NoGradGuard no_grad;
  return o.min_val.numel() > 0 && le(o.min_val, o.max_val).all().item<bool>();
}

namespace {
constexpr const char* kChild = "activation_post_process";
}  // namespace

Tensor QuantStub::forward(const Tensor& x) {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[QuantStub] expects a floating tensor");
  switch (stage_) {
    case Stage::Float:
      return x;
    case Stage::Observing: {
      NoGradGuard no_grad;
      (*observer_)(x.detach());
      return x;
    }
    case Stage::FakeQuantizing:
      return (*fake_quant_)(x);
    case Stage::Quantized:
      break;
  }
  NoGradGuard no_grad;  // a quantize is not differentiable (PyTorch's returns a quantized tensor)
  return fake_quantize_per_tensor_affine(x.detach(), scale(), zero_point(), range_.quant_min, range_.quant_max);
}

void QuantStub::set_observer(std::unique_ptr<Observer> observer) {
  STRATA_CHECK(stage_ == Stage::Float, "[QuantStub] is prepared or converted already");
  STRATA_CHECK(observer != nullptr && !observer->per_channel(), "[QuantStub] needs a per-tensor observer");
  observer_ = &register_module(kChild, std::move(observer));
  stage_ = Stage::Observing;
}

void QuantStub::set_fake_quant(std::unique_ptr<FakeQuantize> fake_quant) {
  STRATA_CHECK(stage_ == Stage::Float, "[QuantStub] is prepared or converted already");
  STRATA_CHECK(fake_quant != nullptr && !fake_quant->per_channel(), "[QuantStub] needs a per-tensor fake quant");
  fake_quant_ = &register_module(kChild, std::move(fake_quant));
  stage_ = Stage::FakeQuantizing;
}

void QuantStub::replacing_child(nn::Module*, nn::Module*) {
  STRATA_CHECK(false, "[QuantStub] its \"{}\" cannot be replaced: prepare a new QuantStub instead", kChild);
}

bool QuantStub::convertible() const {
  return stage_ == Stage::FakeQuantizing || (stage_ == Stage::Observing && detail::calibrated(*observer_));
}

void QuantStub::convert() {
  STRATA_CHECK(convertible(), "[QuantStub] cannot convert: {}", stage_ == Stage::Observing
               ? "its observer has seen no data (run calibration batches after prepare)"
               : "it is not prepared (quant::prepare or prepare_qat)");
  NoGradGuard no_grad;
  Tensor s, z;
  if (stage_ == Stage::Observing) {
    std::tie(s, z) = observer_->calculate_qparams();
    range_ = observer_->range();
  } else {
    std::tie(s, z) = fake_quant_->qparams();
    range_ = {fake_quant_->quant_min(), fake_quant_->quant_max()};
  }
  scale_ = register_buffer("scale", s.reshape({1}).to(kFloat32).cpu());
  zero_point_ = register_buffer("zero_point", z.reshape({1}).to(kInt32).cpu());
  unregister(kChild);
  observer_ = nullptr;
  fake_quant_ = nullptr;
  stage_ = Stage::Quantized;
}

double QuantStub::scale() const {
  STRATA_CHECK(stage_ == Stage::Quantized, "[QuantStub] has no fixed scale before convert");
  return scale_.item<double>();
}

int64_t QuantStub::zero_point() const {
  STRATA_CHECK(stage_ == Stage::Quantized, "[QuantStub] has no fixed zero point before convert");
  return zero_point_.item<int64_t>();
}

Tensor DeQuantStub::forward(const Tensor& x) {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[DeQuantStub] expects a floating tensor");
  return x;
}

QuantWrapper::QuantWrapper(std::unique_ptr<nn::Module> module) {
  STRATA_CHECK(module != nullptr, "[QuantWrapper] the wrapped module is null");
  quant_ = &register_module("quant", std::make_unique<QuantStub>());
  dequant_ = &register_module("dequant", std::make_unique<DeQuantStub>());
  module_ = &register_module("module", std::move(module));
}

Tensor QuantWrapper::forward(const Tensor& x) { return (*dequant_)((*module_)((*quant_)(x))); }

void QuantWrapper::replacing_child(nn::Module* old, nn::Module* now) {
  if (old == module_) {
    module_ = now;
    return;
  }
  STRATA_CHECK(false, "[QuantWrapper] its quant and dequant stubs cannot be replaced");
}

}  // namespace strata::quant
