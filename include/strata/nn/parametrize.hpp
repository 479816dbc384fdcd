// Parametrizations, after torch.nn.utils.parametrize: a module's tensor ("weight") becomes a
// function of other tensors. The tensor's value before registration (or what the
// parametrization's right_inverse makes of it) moves to the parameter
// `parametrizations.<name>.original` (or `original0`, `original1`, ... when right_inverse returns
// several), which is what an optimizer trains; the tensor the module reads is recomputed as
// p_n(...p_1(p_0(originals))) before each of its forwards. State dict keys are PyTorch's.
//
//   struct Symmetric : nn::Module {
//     Tensor forward(const Tensor& x) override { return x.triu() + x.triu(1).transpose(0, 1); }
//   };
//   nn::Linear fc(8, 8);
//   nn::parametrize::register_parametrization(fc, "weight", std::make_unique<Symmetric>());
//   optim::SGD opt(fc.parameters(), {.lr = 0.1});  // trains parametrizations.weight.original
//   { auto scope = nn::parametrize::cached(); for (...) y = fc(y); }  // computed once in the scope
//   nn::parametrize::remove_parametrizations(fc, "weight");  // fc.weight is a parameter again
//
// Note [Parametrized members]: strata's layers read their tensors through data members
// (`Linear::weight`), not through an attribute lookup that could be redirected as PyTorch's
// property is. So the member keeps its handle, and a forward pre-hook registered (first) on the
// module recomputes the value and points that handle at the result: the member then holds the
// computed tensor, with its autograd history, so the forward uses the parametrized value and the
// gradient reaches the originals. Consequences:
// - the member is refreshed when the module is called through a call operator (as containers
//   call their children); a forward() called directly uses the value of the last refresh, and
//   get(module, name) recomputes on demand;
// - the member's old handle is no longer a parameter: build the optimizer after registering (and
//   again after remove_parametrizations), as parameters() then lists the originals;
// - concurrent forwards of one parametrized module on several threads are not supported (each
//   refresh repoints the shared member);
// - a graph that saved the member sees the newest refresh: a module called several times before
//   one backward, with a value that changes between computations (spectral_norm in training),
//   needs a cached() scope for exact input gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <strata/nn/module.hpp>

namespace strata::nn::parametrize {

/// A parametrization with a right_inverse, or one computed from several originals. Any Module
/// with forward(X) works as a parametrization; derive from this class for the rest.
class STRATA_API Parametrization : public Module {
 public:
  using Module::forward;
  /// The value from the originals: forward(originals[0]) unless overridden. Only the first
  /// parametrization of a tensor sees several (those its right_inverse returned).
  virtual Tensor forward_originals(const std::vector<Tensor>& originals);
  /// Whether right_inverse is defined; without one the original is the tensor itself (at
  /// registration) and set() raises.
  virtual bool has_right_inverse() const { return false; }
  /// The originals that give `value` (called with grad mode off): one tensor, or several for the
  /// first parametrization of a tensor (weight norm's {g, v}).
  virtual std::vector<Tensor> right_inverse(const Tensor& value);
  std::string name() const override { return "Parametrization"; }
};

/// The parametrizations of one tensor (the child `parametrizations.<name>`): the children "0",
/// "1", ... in the order they apply, and the originals as parameters (or buffers, for a
/// parametrized buffer).
class STRATA_API ParametrizationList : public Module {
 public:
  std::string name() const override { return "ParametrizationList"; }
  size_t size() const { return items_.size(); }
  Module& operator[](size_t i) const;
  /// The parametrized value, computed now from the originals (with the current grad mode).
  Tensor compute() const;
  /// The originals: {original}, or {original0, original1, ...}.
  const std::vector<Tensor>& originals() const { return originals_; }
  /// Whether there is one original (named "original").
  bool is_tensor() const { return originals_.size() == 1; }
  bool unsafe() const { return unsafe_; }

 protected:
  void replacing_child(Module* old, Module* now) override;

 private:
  friend struct Access;
  std::vector<Module*> items_;
  std::vector<Tensor> originals_;  // handles on the registered originals
  Tensor target_;                  // the handle the module reads (its data member), repointed at each refresh
  bool unsafe_ = false;
  bool was_buffer_ = false, buffer_persistent_ = true;
  uint64_t cache_generation_ = 0;  // the cached() scope whose value target_ holds (0: none)
};

/// Adds `parametrization` to the tensor `tensor_name` of `module` (a parameter, a buffer, or a
/// tensor already parametrized, in which case it applies after the others). Unless `unsafe`,
/// checks that the parametrized value keeps the tensor's shape and dtype (and that
/// right_inverse gives back a tensor like its input). Raises, changing nothing, when the module
/// has no such tensor or a check fails.
STRATA_API void register_parametrization(Module& module, const std::string& tensor_name,
                                         std::unique_ptr<Module> parametrization, bool unsafe = false);
/// Whether `module` has a parametrized tensor (named `tensor_name`, when given).
STRATA_API bool is_parametrized(const Module& module, const std::string& tensor_name = "");
/// The parametrizations of `tensor_name` (PyTorch's module.parametrizations.<name>); raises when
/// it is not parametrized.
STRATA_API ParametrizationList& parametrizations(const Module& module, const std::string& tensor_name);
/// Removes the parametrizations of `tensor_name`: it becomes a parameter (or buffer) again,
/// holding the parametrized value (leave_parametrized) or the original (only possible with one
/// original). Raises when the tensor is not parametrized.
STRATA_API void remove_parametrizations(Module& module, const std::string& tensor_name,
                                        bool leave_parametrized = true);
/// Recomputes the parametrized tensor (or takes it from the active cached() scope), points the
/// module's member at it and returns it: PyTorch's reading of module.<name>.
STRATA_API Tensor get(Module& module, const std::string& tensor_name);
/// Sets the originals so that the tensor's value is `value`, through each parametrization's
/// right_inverse, last first (PyTorch's assignment to module.<name>); raises when one has none.
STRATA_API void set(Module& module, const std::string& tensor_name, const Tensor& value);

/// While one lives (on any thread), each parametrized tensor is computed once, on its first
/// refresh, and reused (PyTorch's `with parametrize.cached():`): for a module called many times
/// per step (a recurrent cell), or a weight shared by several modules.
class STRATA_API CachedScope {
 public:
  CachedScope();
  ~CachedScope();
  CachedScope(const CachedScope&) = delete;
  CachedScope& operator=(const CachedScope&) = delete;
};
[[nodiscard]] inline CachedScope cached() { return {}; }

}  // namespace strata::nn::parametrize
