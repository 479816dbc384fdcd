// Containers that own their children: Sequential (chains one-input forwards), ModuleList and
// ModuleDict. Children are named "0", "1", ... (or by key), as in PyTorch's state_dict.
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include <strata/nn/module.hpp>

namespace strata::nn {

class STRATA_API ModuleList : public Module {
 public:
  ModuleList() = default;
  template <class... Ms, std::enable_if_t<(std::is_base_of_v<Module, std::decay_t<Ms>> && ...), int> = 0>
  explicit ModuleList(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }
  /// Appends a module (moved in) and returns a reference to the stored one.
  template <class M, std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>, int> = 0>
  std::decay_t<M>& push_back(M&& module) {
    return push_back(std::make_unique<std::decay_t<M>>(std::forward<M>(module)));
  }
  template <class M> M& push_back(std::unique_ptr<M> module) {
    M& ref = register_module(std::to_string(items_.size()), std::move(module));
    items_.push_back(&ref);
    return ref;
  }
  Module& operator[](size_t i) const;
  template <class M> M& at(size_t i) const {
    M* m = dynamic_cast<M*>(&(*this)[i]);
    if (!m) ::strata::detail::throw_error("[ModuleList] item {} is a {}, not the type asked for", i, (*this)[i].name());
    return *m;
  }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  std::string name() const override { return "ModuleList"; }

 protected:
  void replacing_child(Module* old, Module* now) override;

 private:
  std::vector<Module*> items_;
};

class STRATA_API Sequential : public ModuleList {
 public:
  using ModuleList::ModuleList;
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Sequential"; }
};

class STRATA_API ModuleDict : public Module {
 public:
  template <class M, std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>, int> = 0>
  std::decay_t<M>& insert(const std::string& key, M&& module) {
    auto& ref = register_module(key, std::make_unique<std::decay_t<M>>(std::forward<M>(module)));
    keys_.push_back(key);
    items_.push_back(&ref);
    return ref;
  }
  Module& operator[](const std::string& key) const;
  bool contains(const std::string& key) const;
  size_t size() const { return items_.size(); }
  const std::vector<std::string>& keys() const { return keys_; }
  std::string name() const override { return "ModuleDict"; }

 protected:
  void replacing_child(Module* old, Module* now) override;

 private:
  std::vector<std::string> keys_;
  std::vector<Module*> items_;
};

}  // namespace strata::nn
