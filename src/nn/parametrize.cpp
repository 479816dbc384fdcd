// Parametrized tensors (nn/parametrize.hpp): registration and removal, the forward pre-hook that
// refreshes a module's parametrized members (Note [Parametrized members]), and cached() scopes.
#include <algorithm>
#include <atomic>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/parametrize.hpp>

namespace strata::nn::parametrize {

namespace {

// cached(): the number of live scopes, and which scope (numbered as outermost scopes open) a
// value was computed in.
std::atomic<int64_t> cache_depth{0};
std::atomic<uint64_t> cache_generation{0};

// The child "parametrizations" of a parametrized module (PyTorch's ModuleDict of the same name):
// one ParametrizationList per tensor, and the pre-hook that refreshes them.
class ParametrizationDict : public Module {
 public:
  std::string name() const override { return "ModuleDict"; }
  ParametrizationList* find(const std::string& key) const {
    for (auto& [n, m] : named_children())
      if (n == key) return dynamic_cast<ParametrizationList*>(m);
    return nullptr;
  }
  ParametrizationList& add(const std::string& key, std::unique_ptr<ParametrizationList> list) {
    return register_module(key, std::move(list));
  }
  void erase(const std::string& key) { unregister(key); }
  bool empty() const { return named_children().empty(); }
  RemovableHandle hook;

 protected:
  void replacing_child(Module*, Module*) override {
    detail::throw_error("[parametrize] a ParametrizationList cannot be replaced; use remove_parametrizations");
  }
};

constexpr const char* kDictName = "parametrizations";

ParametrizationDict* dict_of(const Module& module) {
  for (auto& [n, m] : module.named_children())
    if (n == kDictName) return dynamic_cast<ParametrizationDict*>(m);
  return nullptr;
}

void check_like(const char* op, const char* what, const Tensor& got, const Tensor& want) {
  STRATA_CHECK(got.defined(), "[{}] {} is undefined", op, what);
  STRATA_CHECK(got.dtype() == want.dtype() && got.shape() == want.shape(),
               "[{}] {} is {} {}, where {} {} was expected (pass unsafe = true to allow a parametrization that "
               "changes the shape or dtype)", op, what, got.dtype(), got.shape(), want.dtype(), want.shape());
}

Parametrization* with_inverse(Module& m) {
  auto* p = dynamic_cast<Parametrization*>(&m);
  return p && p->has_right_inverse() ? p : nullptr;
}

// Points `target` (the module's member) at `value`, history included (Note [Parametrized members]).
void point_at(const Tensor& target, const Tensor& value) {
  target.set_data(value);
  target.impl().autograd = value.impl().autograd;
}

// Module's protected registration functions, reached through a derived class: parametrizing
// registers and unregisters on a module from outside it, as PyTorch's setattr and delattr do.
struct ModuleOpener : Module {
  static Tensor register_parameter_on(Module& m, std::string name, const Tensor& t, bool requires_grad) {
    return (m.*(&ModuleOpener::register_parameter))(std::move(name), t, requires_grad);
  }
  static void unregister_on(Module& m, const std::string& name) { (m.*(&ModuleOpener::unregister))(name); }
  static bool is_persistent_buffer_of(const Module& m, const std::string& name) {
    return (m.*(&ModuleOpener::is_persistent_buffer))(name);
  }
  template <class M> static M& register_module_on(Module& m, std::string name, std::unique_ptr<M> child) {
    using Fn = M& (Module::*)(std::string, std::unique_ptr<M>);
    return (m.*static_cast<Fn>(&ModuleOpener::register_module<M>))(std::move(name), std::move(child));
  }
};

// The module's own tensor `name` among `list` (its named_parameters or named_buffers), or undefined.
Tensor own(const std::vector<std::pair<std::string, Tensor>>& list, const std::string& name) {
  for (const auto& [n, t] : list)
    if (n == name) return t;
  return Tensor();
}

bool name_taken(const Module& m, const std::string& name) {
  if (own(m.named_parameters(false), name).defined() || own(m.named_buffers(false), name).defined()) return true;
  for (const auto& [n, c] : m.named_children())
    if (n == name) return true;
  return false;
}

}  // namespace

// What registration needs of ParametrizationList's private parts.
struct Access {
  static void add_original(ParametrizationList& list, std::string name, const Tensor& value, bool buffer,
                           bool persistent, bool requires_grad) {
    Tensor t = value.detach();
    list.originals_.push_back(buffer ? list.register_buffer(std::move(name), t, persistent)
                                     : ModuleOpener::register_parameter_on(list, std::move(name), t, requires_grad));
  }
  static void add_item(ParametrizationList& list, std::unique_ptr<Module> p) {
    list.items_.push_back(&ModuleOpener::register_module_on(list, std::to_string(list.items_.size()), std::move(p)));
  }
  // Points the module's member at the parametrized value (Note [Parametrized members]) and returns it.
  static const Tensor& refresh(ParametrizationList& list) {
    const uint64_t generation = cache_depth.load() > 0 ? cache_generation.load() : 0;
    if (generation != 0 && list.cache_generation_ == generation) return list.target_;
    point_at(list.target_, list.compute());
    list.cache_generation_ = generation;
    return list.target_;
  }
  // Points the member at `value`, computed without grad: a cached() scope recomputes it.
  static void settle(ParametrizationList& list, const Tensor& value) {
    point_at(list.target_, value);
    list.cache_generation_ = 0;
  }
  static void refresh_without_grad(ParametrizationList& list) {
    NoGradGuard no_grad;
    settle(list, list.compute());
  }

  static void register_first(Module& module, const std::string& name, std::unique_ptr<Module> p, bool unsafe) {
    constexpr const char* op = "register_parametrization";
    const Tensor param = own(module.named_parameters(false), name), buffer = own(module.named_buffers(false), name);
    STRATA_CHECK(param.defined() || buffer.defined(),
                 "[{}] {} has no parameter, buffer or parametrized tensor named \"{}\"", op, module.name(), name);
    ParametrizationDict* dict = dict_of(module);
    STRATA_CHECK(dict || !name_taken(module, kDictName), "[{}] {} has a member named \"{}\" already", op,
                 module.name(), kDictName);
    const bool is_buffer = !param.defined();
    const Tensor target = is_buffer ? buffer : param;
    const bool persistent = is_buffer && ModuleOpener::is_persistent_buffer_of(module, name);

    auto list = std::make_unique<ParametrizationList>();
    std::vector<Tensor> originals{target};
    if (Parametrization* inverse = with_inverse(*p)) {
      NoGradGuard no_grad;
      originals = inverse->right_inverse(target);
      STRATA_CHECK(!originals.empty(), "[{}] right_inverse of {} returned no tensor", op, p->name());
      for (const Tensor& t : originals)
        STRATA_CHECK(t.defined(), "[{}] right_inverse of {} returned an undefined tensor", op, p->name());
      STRATA_CHECK(originals.size() > 1 || originals[0].dtype() == target.dtype(),
                   "[{}] right_inverse of {} changed the dtype of \"{}\" from {} to {}", op, p->name(), name,
                   target.dtype(), originals[0].dtype());
    }
    for (size_t i = 0; i < originals.size(); ++i)
      add_original(*list, originals.size() == 1 ? "original" : "original" + std::to_string(i), originals[i],
                   is_buffer, persistent, target.requires_grad());
    add_item(*list, std::move(p));
    list->unsafe_ = unsafe;
    list->was_buffer_ = is_buffer;
    list->buffer_persistent_ = persistent;
    list->target_ = target;
    Tensor value;  // computed (unsafe too) before the module changes, as it may raise
    {
      NoGradGuard no_grad;
      value = list->compute();
    }
    if (!unsafe) check_like(op, fmt::format("the parametrized \"{}\"", name).c_str(), value, target);
    // every check passed: from here on nothing raises
    if (is_buffer) {
      module.remove_buffer(name);
    } else {
      ModuleOpener::unregister_on(module, name);
    }
    if (!dict) {
      dict = &ModuleOpener::register_module_on(module, kDictName, std::make_unique<ParametrizationDict>());
      dict->hook = module.register_forward_pre_hook(
          [](Module& m, const Tensor&) {
            if (ParametrizationDict* d = dict_of(m))
              for (auto& [n, list] : d->named_children()) refresh(static_cast<ParametrizationList&>(*list));
          },
          /*prepend=*/true);
    }
    settle(dict->add(name, std::move(list)), value);
  }

  static void register_next(ParametrizationList& list, const std::string& name, std::unique_ptr<Module> p,
                            bool unsafe) {
    constexpr const char* op = "register_parametrization";
    Tensor x;  // computed (unsafe too) before the chain changes, as it may raise
    {
      NoGradGuard no_grad;
      const Tensor y = list.compute();
      x = (*p)(y);
      Parametrization* inverse = unsafe ? nullptr : with_inverse(*p);
      if (!unsafe) check_like(op, fmt::format("{} applied to \"{}\"", p->name(), name).c_str(), x, y);
      if (inverse) {
        std::vector<Tensor> z = inverse->right_inverse(x);
        STRATA_CHECK(z.size() == 1, "[{}] right_inverse of {} returned {} tensors; only the first parametrization "
                     "of a tensor may return several", op, p->name(), z.size());
        check_like(op, fmt::format("right_inverse of {}", p->name()).c_str(), z[0], x);
      }
    }
    add_item(list, std::move(p));
    list.unsafe_ = list.unsafe_ || unsafe;
    settle(list, x);
  }

  static void remove(Module& module, const std::string& name, bool leave_parametrized) {
    constexpr const char* op = "remove_parametrizations";
    ParametrizationDict* dict = dict_of(module);
    ParametrizationList* list = dict ? dict->find(name) : nullptr;
    STRATA_CHECK(list, "[{}] {} has no parametrization on \"{}\"", op, module.name(), name);
    STRATA_CHECK(leave_parametrized || list->is_tensor(), "[{}] \"{}\" is parametrized by {} tensors, so it cannot "
                 "be left unparametrized (leave_parametrized = false)", op, name, list->originals_.size());
    Tensor value;
    {
      NoGradGuard no_grad;
      value = leave_parametrized ? list->compute() : list->originals_[0];
    }
    const Tensor target = list->target_;
    const bool is_buffer = list->was_buffer_, persistent = list->buffer_persistent_;
    // as PyTorch's, the parametrized value's: it needs a gradient when any original does
    const bool requires_grad = std::any_of(list->originals_.begin(), list->originals_.end(),
                                           [](const Tensor& t) { return t.requires_grad(); });
    STRATA_CHECK(!name_taken(module, name), "[{}] {} has a member named \"{}\" again", op, module.name(), name);
    // every check passed: from here on nothing raises
    dict->erase(name);
    if (dict->empty()) {
      dict->hook.remove();
      ModuleOpener::unregister_on(module, kDictName);
    }
    target.impl().autograd.reset();  // a leaf again, with no history
    target.set_data(value);
    if (is_buffer) {
      module.register_buffer(name, target, persistent);
    } else {
      ModuleOpener::register_parameter_on(module, name, target, requires_grad);
    }
  }
};

Tensor Parametrization::forward_originals(const std::vector<Tensor>& originals) {
  STRATA_CHECK(originals.size() == 1, "[{}] takes one original, got {}; override forward_originals to take several",
               name(), originals.size());
  return (*this)(originals[0]);
}

std::vector<Tensor> Parametrization::right_inverse(const Tensor&) {
  detail::throw_error("[{}] has no right_inverse", name());
}

Module& ParametrizationList::operator[](size_t i) const {
  STRATA_CHECK(i < items_.size(), "[ParametrizationList] index {} out of range for {} parametrizations", i,
               items_.size());
  return *items_[i];
}

Tensor ParametrizationList::compute() const {
  STRATA_CHECK(!items_.empty(), "[ParametrizationList] has no parametrization");
  Tensor x;
  if (originals_.size() == 1) {
    x = (*items_[0])(originals_[0]);
  } else {
    auto* first = dynamic_cast<Parametrization*>(items_[0]);
    STRATA_CHECK(first, "[ParametrizationList] {} is not a Parametrization and cannot take {} originals",
                 items_[0]->name(), originals_.size());
    x = first->forward_originals(originals_);
  }
  for (size_t i = 1; i < items_.size(); ++i) x = (*items_[i])(x);
  return x;
}

void ParametrizationList::replacing_child(Module* old, Module* now) {
  for (Module*& m : items_)
    if (m == old) m = now;
}

void register_parametrization(Module& module, const std::string& tensor_name, std::unique_ptr<Module> parametrization,
                              bool unsafe) {
  STRATA_CHECK(parametrization != nullptr, "[register_parametrization] the parametrization of \"{}\" is null",
               tensor_name);
  ParametrizationDict* dict = dict_of(module);
  if (ParametrizationList* list = dict ? dict->find(tensor_name) : nullptr) {
    Access::register_next(*list, tensor_name, std::move(parametrization), unsafe);
  } else {
    Access::register_first(module, tensor_name, std::move(parametrization), unsafe);
  }
}

bool is_parametrized(const Module& module, const std::string& tensor_name) {
  const ParametrizationDict* dict = dict_of(module);
  if (!dict) return false;
  return tensor_name.empty() ? !dict->empty() : dict->find(tensor_name) != nullptr;
}

ParametrizationList& parametrizations(const Module& module, const std::string& tensor_name) {
  const ParametrizationDict* dict = dict_of(module);
  ParametrizationList* list = dict ? dict->find(tensor_name) : nullptr;
  STRATA_CHECK(list, "[parametrize] {} has no parametrization on \"{}\"", module.name(), tensor_name);
  return *list;
}

void remove_parametrizations(Module& module, const std::string& tensor_name, bool leave_parametrized) {
  Access::remove(module, tensor_name, leave_parametrized);
}

Tensor get(Module& module, const std::string& tensor_name) {
  ParametrizationList& list = parametrizations(module, tensor_name);
  return Access::refresh(list);
}

void set(Module& module, const std::string& tensor_name, const Tensor& value) {
  ParametrizationList& list = parametrizations(module, tensor_name);
  STRATA_CHECK(value.defined(), "[parametrize::set] the value for \"{}\" is undefined", tensor_name);
  std::vector<Tensor> originals{value};
  {
    NoGradGuard no_grad;
    for (size_t i = list.size(); i-- > 0;) {
      Parametrization* inverse = with_inverse(list[i]);
      STRATA_CHECK(inverse, "[parametrize::set] parametrization {} ({}) of \"{}\" has no right_inverse", i,
                   list[i].name(), tensor_name);
      originals = inverse->right_inverse(originals[0]);
      STRATA_CHECK(i == 0 || originals.size() == 1, "[parametrize::set] right_inverse of {} returned {} tensors; "
                   "only the first parametrization may return several", list[i].name(), originals.size());
    }
    const std::vector<Tensor>& own = list.originals();
    STRATA_CHECK(originals.size() == own.size(), "[parametrize::set] right_inverse gave {} tensors for {} originals",
                 originals.size(), own.size());
    for (size_t i = 0; i < own.size(); ++i)
      STRATA_CHECK(originals[i].defined() && originals[i].dtype() == own[i].dtype(),
                   "[parametrize::set] right_inverse gave original {} of dtype {}, where the original is {}", i,
                   originals[i].defined() ? fmt::format("{}", originals[i].dtype()) : "undefined", own[i].dtype());
    for (size_t i = 0; i < own.size(); ++i) {  // in place where the shape allows, so handles and layouts stay
      if (originals[i].shape() == own[i].shape()) {
        own[i].copy_(originals[i]);
      } else {
        own[i].set_data(originals[i].clone());
      }
    }
  }
  Access::refresh_without_grad(list);
}

CachedScope::CachedScope() {
  if (cache_depth.fetch_add(1) == 0) cache_generation.fetch_add(1);
}

CachedScope::~CachedScope() { cache_depth.fetch_sub(1); }

}  // namespace strata::nn::parametrize
