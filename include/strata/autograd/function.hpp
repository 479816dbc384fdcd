// Custom differentiable functions: derive from Function<T> and write static forward() and
// backward(), as in torch.autograd.Function.
//
//   struct Cube : strata::autograd::Function<Cube> {
//     static Tensor forward(AutogradContext& ctx, const Tensor& x) {
//       ctx.save_for_backward({x});
//       return x * x * x;
//     }
//     static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& g) {
//       Tensor x = ctx.saved()[0];
//       return {g[0] * x * x * 3};
//     }
//   };
//   Tensor y = Cube::apply(x);
//
// forward runs with grad mode off and returns a Tensor or a std::vector<Tensor>; backward
// returns one gradient (or an undefined tensor) per Tensor argument of forward, in order.
#pragma once

#include <any>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/autograd/graph.hpp>

namespace strata::autograd {

class AutogradContext {
 public:
  /// Tensors backward will need; inputs or outputs of forward.
  void save_for_backward(std::vector<Tensor> tensors) { to_save_ = std::move(tensors); }
  /// The saved tensors (checked against in-place modification).
  std::vector<Tensor> saved() const {
    std::vector<Tensor> out;
    auto owner = node_.lock();
    for (const SavedTensor& s : saved_) out.push_back(s.unpack(owner));
    return out;
  }
  /// Outputs that get no gradient (indices, masks).
  void mark_non_differentiable(std::vector<Tensor> outputs) { non_differentiable_ = std::move(outputs); }
  /// Whether the i-th Tensor argument of forward requires a gradient.
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  /// Anything else backward needs (sizes, flags).
  std::map<std::string, std::any> saved_data;

 private:
  template <class> friend struct Function;
  template <class> friend class CppNode;
  std::vector<Tensor> to_save_;
  std::vector<SavedTensor> saved_;
  std::vector<Tensor> non_differentiable_;
  std::vector<bool> needs_input_grad_;
  std::weak_ptr<Node> node_;
};

template <class F>
class CppNode final : public Node {
 public:
  Grads apply(Grads&& grads) override {
    STRATA_CHECK(!released_, "[autograd] trying to backward through {} a second time, after its saved tensors were "
                 "freed; pass retain_graph=true to the first backward", name());
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined())
        grads[i] = zeros_like_meta(output_meta[i]);
    Grads out = F::backward(ctx, grads);
    STRATA_CHECK(out.size() == next_edges.size(), "[{}] backward returned {} gradients for {} tensor inputs", name(),
                 out.size(), next_edges.size());
    return out;
  }
  std::string name() const override { return typeid(F).name(); }
  void release_saved() override {
    if (ctx.saved_.empty()) return;
    ctx.saved_.clear();
    released_ = true;
  }
  AutogradContext ctx;

 private:
  static Tensor zeros_like_meta(const TensorMeta& m);
  bool released_ = false;
};

namespace detail {
STRATA_API Tensor zeros_for_meta(const TensorMeta& m);
inline void collect(std::vector<Tensor>& out, const Tensor& t) { out.push_back(t); }
inline void collect(std::vector<Tensor>& out, const std::vector<Tensor>& ts) { out.insert(out.end(), ts.begin(), ts.end()); }
template <class T> void collect(std::vector<Tensor>&, const T&) {}
inline void outputs_of(std::vector<Tensor>& out, const Tensor& t) { out.push_back(t); }
inline void outputs_of(std::vector<Tensor>& out, const std::vector<Tensor>& ts) { out = ts; }
}  // namespace detail

template <class F>
Tensor CppNode<F>::zeros_like_meta(const TensorMeta& m) {
  return detail::zeros_for_meta(m);
}

template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    std::vector<Tensor> inputs;
    (detail::collect(inputs, args), ...);
    auto node = std::make_shared<CppNode<Derived>>();
    node->ctx.node_ = node;
    for (const Tensor& t : inputs) node->ctx.needs_input_grad_.push_back(t.defined() && t.requires_grad());
    using Out = decltype(Derived::forward(node->ctx, std::forward<Args>(args)...));
    static_assert(std::is_same_v<Out, Tensor> || std::is_same_v<Out, std::vector<Tensor>>,
                  "forward must return Tensor or std::vector<Tensor>");
    bool record = any_requires_grad(inputs);
    Out result;
    {
      NoGradGuard no_grad;
      result = Derived::forward(node->ctx, std::forward<Args>(args)...);
    }
    if (!record) return result;
    std::vector<Tensor> outputs;
    detail::outputs_of(outputs, result);
    for (const Tensor& in : inputs) {
      bool needs = in.defined() && in.requires_grad();
      node->next_edges.push_back(needs ? gradient_edge(in) : Edge{});
      node->input_meta.push_back(in.defined() ? TensorMeta{in.shape(), in.dtype(), in.device()} : TensorMeta{});
    }
    // outputs that alias an input get fresh handles, so the input keeps its own history (and
    // mark_output has in-place ops under autograd refuse them)
    for (Tensor& out : outputs)
      for (const Tensor& in : inputs)
        if (out.is_same(in)) out = out.detach();
    for (size_t i = 0; i < outputs.size(); ++i) {
      node->output_meta.push_back({outputs[i].shape(), outputs[i].dtype(), outputs[i].device()});
      bool nondiff = false;
      for (const Tensor& n : node->ctx.non_differentiable_) nondiff = nondiff || n.is_same(outputs[i]);
      if (!nondiff && is_floating(outputs[i].dtype())) set_history(outputs[i], node, static_cast<uint32_t>(i));
      detail::mark_output(outputs[i], inputs);
    }
    node->output_hooks.resize(outputs.size());
    for (const Tensor& s : node->ctx.to_save_) {
      bool is_output = false;
      for (const Tensor& o : outputs) is_output = is_output || (s.defined() && s.is_same(o));
      node->ctx.saved_.emplace_back(s, is_output);
    }
    node->ctx.to_save_.clear();
    if constexpr (std::is_same_v<Out, Tensor>) return outputs[0];
    else return outputs;
  }
};

}  // namespace strata::autograd

namespace strata {
using autograd::AutogradContext;
}
