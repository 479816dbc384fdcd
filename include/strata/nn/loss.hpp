// Loss modules: each holds its options and forwards (input, target), or its three inputs, to
// nn::functional. A class weight (and BCEWithLogitsLoss's pos_weight) is registered as a buffer
// named "weight" ("pos_weight"), as in PyTorch.
#pragma once

#include <string>
#include <vector>

#include <strata/nn/functional.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

/// Base of the two-input loss modules: loss(input, target).
class STRATA_API Loss : public Module {
 public:
  using Module::forward;
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  /// forward(input, target) with the hooks around it: their inputs are {input, target}.
  Tensor operator()(const Tensor& input, const Tensor& target) {
    if (!hooks_active()) return forward(input, target);
    return call_hooked({input, target}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1]); });
  }
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

/// Base of the three-input loss modules: MarginRankingLoss and CosineEmbeddingLoss (input1,
/// input2, target), TripletMarginLoss (anchor, positive, negative), GaussianNLLLoss (input,
/// target, var).
class STRATA_API ThreeInputLoss : public Module {
 public:
  using Module::forward;
  virtual Tensor forward(const Tensor& a, const Tensor& b, const Tensor& c) = 0;
  /// forward(a, b, c) with the hooks around it: their inputs are {a, b, c}.
  Tensor operator()(const Tensor& a, const Tensor& b, const Tensor& c) {
    if (!hooks_active()) return forward(a, b, c);
    return call_hooked({a, b, c}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1], in[2]); });
  }
};

class STRATA_API BCELoss : public Loss {
 public:
  explicit BCELoss(functional::BCEOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "BCELoss"; }
  functional::BCEOptions options;
};

struct HuberLossOptions {
  std::string reduction = "mean";
  double delta = 1.0;
};

class STRATA_API HuberLoss : public Loss {
 public:
  explicit HuberLoss(HuberLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "HuberLoss"; }
  HuberLossOptions options;
};

class STRATA_API SoftMarginLoss : public Loss {
 public:
  explicit SoftMarginLoss(std::string reduction = "mean");
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "SoftMarginLoss"; }
  std::string reduction;
};

struct MarginRankingLossOptions {
  double margin = 0;
  std::string reduction = "mean";
};

class STRATA_API MarginRankingLoss : public ThreeInputLoss {
 public:
  explicit MarginRankingLoss(MarginRankingLossOptions options = {});
  using ThreeInputLoss::forward;
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target) override;
  std::string name() const override { return "MarginRankingLoss"; }
  MarginRankingLossOptions options;
};

struct HingeEmbeddingLossOptions {
  double margin = 1.0;
  std::string reduction = "mean";
};

class STRATA_API HingeEmbeddingLoss : public Loss {
 public:
  explicit HingeEmbeddingLoss(HingeEmbeddingLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "HingeEmbeddingLoss"; }
  HingeEmbeddingLossOptions options;
};

struct CosineEmbeddingLossOptions {
  double margin = 0;
  std::string reduction = "mean";
};

class STRATA_API CosineEmbeddingLoss : public ThreeInputLoss {
 public:
  explicit CosineEmbeddingLoss(CosineEmbeddingLossOptions options = {});
  using ThreeInputLoss::forward;
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target) override;
  std::string name() const override { return "CosineEmbeddingLoss"; }
  CosineEmbeddingLossOptions options;
};

class STRATA_API TripletMarginLoss : public ThreeInputLoss {
 public:
  explicit TripletMarginLoss(functional::TripletMarginLossOptions options = {});
  using ThreeInputLoss::forward;
  Tensor forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) override;
  std::string name() const override { return "TripletMarginLoss"; }
  functional::TripletMarginLossOptions options;
};

class STRATA_API PoissonNLLLoss : public Loss {
 public:
  explicit PoissonNLLLoss(functional::PoissonNLLLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "PoissonNLLLoss"; }
  functional::PoissonNLLLossOptions options;
};

class STRATA_API GaussianNLLLoss : public ThreeInputLoss {
 public:
  explicit GaussianNLLLoss(functional::GaussianNLLLossOptions options = {});
  using ThreeInputLoss::forward;
  Tensor forward(const Tensor& input, const Tensor& target, const Tensor& var) override;
  std::string name() const override { return "GaussianNLLLoss"; }
  functional::GaussianNLLLossOptions options;
};

class STRATA_API MultiLabelSoftMarginLoss : public Loss {
 public:
  explicit MultiLabelSoftMarginLoss(functional::MultiLabelSoftMarginLossOptions options = {});
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  std::string name() const override { return "MultiLabelSoftMarginLoss"; }
  functional::MultiLabelSoftMarginLossOptions options;
};

}  // namespace strata::nn
