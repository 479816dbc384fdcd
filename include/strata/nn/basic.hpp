// Shape-only layers: Flatten (merges a range of dims, a view when the strides allow), Unflatten
// (splits one dim) and Identity.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <strata/nn/module.hpp>

namespace strata::nn {

class STRATA_API Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim, end_dim); }
  std::string name() const override { return "Flatten"; }

  int64_t start_dim, end_dim;
};

class STRATA_API Unflatten : public Module {
 public:
  /// sizes' product must equal the size of dim; one entry may be -1 (inferred).
  Unflatten(int64_t dim, Shape sizes) : dim(dim), sizes(std::move(sizes)) {}
  Tensor forward(const Tensor& input) override { return input.unflatten(dim, sizes); }
  std::string name() const override { return "Unflatten"; }

  int64_t dim;
  Shape sizes;
};

class STRATA_API Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
  std::string name() const override { return "Identity"; }
};

}  // namespace strata::nn
