// Dropout: in training, zeroes elements with probability p and scales the rest by
// 1 / (1 - p); in eval mode it returns its input.
#pragma once

#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

class STRATA_API Dropout : public Module {
 public:
  /// p in [0, 1]; masks come from gen (default_generator() when null).
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Dropout"; }

  double p;
  Generator* generator;
};

/// Dropout1d and Dropout2d: whole channels dropped (functional::dropout1d, dropout2d).
class STRATA_API Dropout1d : public Module {
 public:
  explicit Dropout1d(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Dropout1d"; }

  double p;
  Generator* generator;
};

class STRATA_API Dropout2d : public Module {
 public:
  explicit Dropout2d(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Dropout2d"; }

  double p;
  Generator* generator;
};

}  // namespace strata::nn
