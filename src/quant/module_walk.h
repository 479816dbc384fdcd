// The Linear layers of a module tree, by dotted name, for quantize_dynamic, prepare_qat and convert.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <strata/nn/linear.hpp>

namespace strata::quant::detail {

using NamedLinear = std::pair<std::string, nn::Linear*>;

/// Every nn::Linear under `model` (itself included) that `filter` accepts (all when null), in
/// pre-order; the layers' own forms are not walked into.
inline std::vector<NamedLinear> linear_layers(
    nn::Module& model, const std::function<bool(const std::string&, const nn::Linear&)>& filter) {
  std::vector<NamedLinear> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* lin = dynamic_cast<nn::Linear*>(m); lin && (!filter || filter(name, *lin))) out.emplace_back(name, lin);
  return out;
}

}  // namespace strata::quant::detail
