// Sequential, ModuleList and ModuleDict.
#include <typeinfo>

#include <strata/nn/activation.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/containers.hpp>

namespace strata::nn {

Module& ModuleList::operator[](size_t i) const {
  STRATA_CHECK(i < items_.size(), "[{}] index {} is out of range for {} modules", name(), i, items_.size());
  return *items_[i];
}

namespace {

// BatchNorm1d/2d itself, not a subclass that may have its own forward.
BatchNormBase* plain_batch_norm(Module& m) {
  const std::type_info& t = typeid(m);
  return t == typeid(BatchNorm2d) || t == typeid(BatchNorm1d) ? static_cast<BatchNormBase*>(&m) : nullptr;
}

}  // namespace

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) {
    Module& m = (*this)[i];
    // a batch norm followed by a ReLU runs as one pass (forward_relu): the same values and
    // gradients, one read and write of the activations fewer
    if (BatchNormBase* bn = plain_batch_norm(m); bn && i + 1 < n && typeid((*this)[i + 1]) == typeid(ReLU)) {
      x = bn->forward_relu(x);
      ++i;
      continue;
    }
    x = m.forward(x);
  }
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
