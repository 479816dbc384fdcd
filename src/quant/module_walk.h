// The quantizable layers of a module tree (nn::Linear, nn::Conv2d, nn::Conv1d, nn::ConvTranspose2d),
// by dotted name, for quantize_dynamic, prepare, prepare_qat and convert.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <strata/nn/conv.hpp>
#include <strata/nn/linear.hpp>
#include <strata/quant/fuse.hpp>

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

/// A Linear, Conv2d, Conv1d or ConvTranspose2d (one pointer set), and the fused module whose first
/// layer it is (null when none).
struct QuantLayer {
  std::string name;
  nn::Linear* linear = nullptr;
  nn::Conv2d* conv = nullptr;
  nn::Conv1d* conv1d = nullptr;
  nn::ConvTranspose2d* conv_transpose = nullptr;
  FusedModule* fused = nullptr;
};

/// f(layer) with the layer as its own type (every call must return one type).
template <class F>
decltype(auto) visit(const QuantLayer& l, F&& f) {
  if (l.linear) return f(*l.linear);
  if (l.conv) return f(*l.conv);
  if (l.conv1d) return f(*l.conv1d);
  return f(*l.conv_transpose);
}

/// Every Linear, Conv2d, Conv1d and ConvTranspose2d under `model` that `filter` accepts (all when null), in pre-order.
inline std::vector<QuantLayer> quant_layers(nn::Module& model,
                                            const std::function<bool(const std::string&, const nn::Module&)>& filter) {
  const auto modules = model.named_modules();
  std::map<nn::Module*, FusedModule*> first_of;
  for (auto& [name, m] : modules)
    if (auto* f = dynamic_cast<FusedModule*>(m); f && f->size() > 0) first_of[&(*f)[0]] = f;
  std::vector<QuantLayer> out;
  for (auto& [name, m] : modules) {
    QuantLayer l{name, dynamic_cast<nn::Linear*>(m), dynamic_cast<nn::Conv2d*>(m), dynamic_cast<nn::Conv1d*>(m),
                 dynamic_cast<nn::ConvTranspose2d*>(m), nullptr};
    if ((!l.linear && !l.conv && !l.conv1d && !l.conv_transpose) || (filter && !filter(name, *m))) continue;
    if (auto it = first_of.find(m); it != first_of.end()) l.fused = it->second;
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace strata::quant::detail
