// Sequential, ModuleList and ModuleDict.
#include <algorithm>
#include <typeinfo>

#include <strata/nn/activation.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/containers.hpp>

namespace strata::nn {

Module& ModuleList::operator[](size_t i) const {
  STRATA_CHECK(i < items_.size(), "[{}] index {} is out of range for {} modules", name(), i, items_.size());
  return *items_[i];
}

void ModuleList::replacing_child(Module* old, Module* now) { std::replace(items_.begin(), items_.end(), old, now); }

void ModuleDict::replacing_child(Module* old, Module* now) { std::replace(items_.begin(), items_.end(), old, now); }

namespace {

// m as a batch norm that may run with the ReLU after it as one pass (forward_relu): BatchNorm1d/2d
// itself (not a subclass that may have its own forward), followed by a ReLU, and no hook that
// must see either call.
BatchNormBase* batch_norm_before_relu(Module& m, const Module* next) {
  const std::type_info& t = typeid(m);
  if (t != typeid(BatchNorm2d) && t != typeid(BatchNorm1d)) return nullptr;
  if (!next || typeid(*next) != typeid(ReLU)) return nullptr;
  if (m.has_hooks() || next->has_hooks() || has_global_forward_hooks()) return nullptr;
  return static_cast<BatchNormBase*>(&m);
}

}  // namespace

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) {
    Module& m = (*this)[i];
    // the same values and gradients, one read and write of the activations fewer
    if (BatchNormBase* bn = batch_norm_before_relu(m, i + 1 < n ? &(*this)[i + 1] : nullptr)) {
      x = bn->forward_relu(x);
      ++i;
      continue;
    }
    x = m(x);
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
