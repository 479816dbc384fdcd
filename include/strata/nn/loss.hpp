// Loss modules: each holds its options and forwards (input, target) to nn::functional. A
// class weight (and BCEWithLogitsLoss's pos_weight) is registered as a buffer named "weight"
// ("pos_weight"), as in PyTorch.
#pragma once

#include <string>

#include <strata/nn/functional.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

/// Base of the two-input loss modules: loss(input, target).
class STRATA_API Loss : public Module {
 public:
  using Module::forward;
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
};

class STRATA_API CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(functional::CrossEntropyOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "CrossEntropyLoss"; }
  functional::CrossEntropyOptions options;
};

class STRATA_API NLLLoss : public Loss {
 public:
  explicit NLLLoss(functional::NLLLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "NLLLoss"; }
  functional::NLLLossOptions options;
};

class STRATA_API MSELoss : public Loss {
 public:
  explicit MSELoss(std::string reduction = "mean");
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "MSELoss"; }
  std::string reduction;
};

class STRATA_API L1Loss : public Loss {
 public:
  explicit L1Loss(std::string reduction = "mean");
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "L1Loss"; }
  std::string reduction;
};

struct SmoothL1LossOptions {
  std::string reduction = "mean";
  double beta = 1.0;
};

class STRATA_API SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(SmoothL1LossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "SmoothL1Loss"; }
  SmoothL1LossOptions options;
};

class STRATA_API BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(functional::BCEWithLogitsOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "BCEWithLogitsLoss"; }
  functional::BCEWithLogitsOptions options;
};

struct KLDivLossOptions {
  std::string reduction = "mean";
  bool log_target = false;
};

class STRATA_API KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(KLDivLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "KLDivLoss"; }
  KLDivLossOptions options;
};

}  // namespace strata::nn
