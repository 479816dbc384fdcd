// Pooling layers: MaxPool1d/2d/3d, AvgPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d and
// AdaptiveMaxPool1d/2d/3d, with torch.nn's arguments and defaults (stride = kernel_size). They
// hold no parameters; each forwards to the nn::functional op of its name. Inputs are (N, C, H, W)
// or (C, H, W), NCHW or channels-last (2-d); (N, C, D, H, W) or (C, D, H, W) (3-d).
//
//   nn::MaxPool2d pool(3, {.stride = 2, .padding = 1});
//   nn::AdaptiveAvgPool2d gap(1);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <strata/nn/functional_conv.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

class STRATA_API MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, functional::MaxPool2dArgs options = {});
  Tensor forward(const Tensor& input) override;
  /// The output and the argmax indices (PyTorch's return_indices=True).
  functional::MaxPoolResult forward_with_indices(const Tensor& input);
  std::string name() const override { return "MaxPool2d"; }

  Size2 kernel_size;
  functional::MaxPool2dArgs options;
};

class STRATA_API AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, functional::AvgPool2dArgs options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AvgPool2d"; }

  Size2 kernel_size;
  functional::AvgPool2dArgs options;
};

class STRATA_API AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveAvgPool2d"; }

  Size2 output_size;
};

class STRATA_API MaxPool1d : public Module {
 public:
  explicit MaxPool1d(int64_t kernel_size, functional::MaxPool1dArgs options = {});
  Tensor forward(const Tensor& input) override;
  functional::MaxPoolResult forward_with_indices(const Tensor& input);
  std::string name() const override { return "MaxPool1d"; }

  int64_t kernel_size;
  functional::MaxPool1dArgs options;
};

class STRATA_API AvgPool1d : public Module {
 public:
  explicit AvgPool1d(int64_t kernel_size, functional::AvgPool1dArgs options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AvgPool1d"; }

  int64_t kernel_size;
  functional::AvgPool1dArgs options;
};

class STRATA_API AdaptiveAvgPool1d : public Module {
 public:
  explicit AdaptiveAvgPool1d(int64_t output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveAvgPool1d"; }

  int64_t output_size;
};

class STRATA_API AdaptiveMaxPool1d : public Module {
 public:
  explicit AdaptiveMaxPool1d(int64_t output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveMaxPool1d"; }

  int64_t output_size;
};

class STRATA_API AdaptiveMaxPool2d : public Module {
 public:
  explicit AdaptiveMaxPool2d(Size2 output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveMaxPool2d"; }

  Size2 output_size;
};

class STRATA_API MaxPool3d : public Module {
 public:
  explicit MaxPool3d(Size3 kernel_size, functional::MaxPool3dArgs options = {});
  Tensor forward(const Tensor& input) override;
  /// The output and the argmax indices (PyTorch's return_indices=True).
  functional::MaxPoolResult forward_with_indices(const Tensor& input);
  std::string name() const override { return "MaxPool3d"; }

  Size3 kernel_size;
  functional::MaxPool3dArgs options;
};

class STRATA_API AvgPool3d : public Module {
 public:
  explicit AvgPool3d(Size3 kernel_size, functional::AvgPool3dArgs options = {});
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AvgPool3d"; }

  Size3 kernel_size;
  functional::AvgPool3dArgs options;
};

class STRATA_API AdaptiveAvgPool3d : public Module {
 public:
  explicit AdaptiveAvgPool3d(Size3 output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveAvgPool3d"; }

  Size3 output_size;
};

class STRATA_API AdaptiveMaxPool3d : public Module {
 public:
  explicit AdaptiveMaxPool3d(Size3 output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AdaptiveMaxPool3d"; }

  Size3 output_size;
};

}  // namespace strata::nn
