// Sequential, ModuleList and ModuleDict.
#include <strata/nn/containers.hpp>

namespace strata::nn {

Module& ModuleList::operator[](size_t i) const {
  STRATA_CHECK(i < items_.size(), "[{}] index {} is out of range for {} modules", name(), i, items_.size());
  return *items_[i];
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (Module* m : *this) x = m->forward(x);
  return x;
}

Module& ModuleDict::operator[](const std::string& key) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return *items_[i];
  detail::throw_error("[ModuleDict] no module named \"{}\"", key);
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& k : keys_)
    if (k == key) return true;
  return false;
}

}  // namespace strata::nn
