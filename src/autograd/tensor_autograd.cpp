// The autograd methods of Tensor.
#include <strata/autograd/autograd.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

#include "autograd/views.h"
#include "core/tensor_internal.h"

namespace strata {

namespace {
autograd::AutogradMeta& meta(const Tensor& t) {
  TensorImpl& impl = t.impl();
  if (!impl.autograd) impl.autograd = std::make_shared<autograd::AutogradMeta>();
  return *impl.autograd;
}
}  // namespace

bool Tensor::requires_grad() const {
  autograd::detail::refresh_view(*this);
  const auto& a = impl().autograd;
  return a && a->requires_grad;
}

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  STRATA_CHECK(is_leaf(), "[requires_grad_] can only be changed on leaf tensors; use detach() for a non-leaf");
  STRATA_CHECK(!requires_grad || is_floating(dtype()), "[requires_grad_] only floating tensors can require grad, got {}",
               dtype());
  meta(*this).requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  autograd::detail::refresh_view(*this);
  const auto& a = impl().autograd;
  return !a || !a->grad_fn;
}

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  const auto& a = impl().autograd;
  return a ? a->grad : undefined;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    STRATA_CHECK(g.shape() == shape(), "[set_grad] gradient of shape {} for a tensor of shape {}", g.shape(), shape());
    STRATA_CHECK(g.device() == device(), "[set_grad] gradient on {} for a tensor on {}", g.device(), device());
    STRATA_CHECK(g.dtype() == dtype(), "[set_grad] gradient of dtype {} for a tensor of dtype {}", g.dtype(), dtype());
  }
  meta(*this).grad = g;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  autograd::detail::refresh_view(*this);
  const auto& a = impl().autograd;
  return a ? a->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{}, retain_graph,
                     create_graph);
}

void Tensor::retain_grad() const {
  STRATA_CHECK(requires_grad(), "[retain_grad] the tensor does not require grad");
  if (is_leaf()) return;  // leaves keep .grad anyway
  auto& m = meta(*this);
  if (m.retains_grad) return;
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  const autograd::Node* node = m.grad_fn.get();
  m.grad_fn->output_hooks[m.output_nr].push_back([weak, node](const Tensor& g) {
    // an in-place op since moved the tensor to a new history, whose own hook retains the grad
    if (auto impl = weak.lock(); impl && impl->autograd->grad_fn.get() == node) {
      auto& a = *impl->autograd;
      // under create_graph the retained gradient keeps its history, as PyTorch's
      a.grad = a.grad.defined() ? a.grad + g : autograd::is_grad_enabled() ? g.clone() : g.detach().clone();
    }
    return Tensor();
  });
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  STRATA_CHECK(requires_grad(), "[register_hook] the tensor does not require grad");
  auto& m = meta(*this);
  if (m.grad_fn) {
    m.grad_fn->output_hooks[m.output_nr].push_back(std::move(hook));
  } else {
    m.hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  STRATA_CHECK(is_leaf() && requires_grad(), "[register_post_accumulate_grad_hook] expects a leaf that requires grad");
  meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace strata

namespace strata::detail {
void clear_grad(const Tensor& p, bool set_to_none) {
  if (!p.defined() || !p.grad().defined()) return;
  if (set_to_none) {
    p.set_grad(Tensor());
    return;
  }
  NoGradGuard no_grad;
  Tensor grad = p.grad().detach();
  // a user-set expanded gradient cannot be zeroed in place
  if (elements_share_memory(grad)) grad = zeros(grad.shape(), TensorOptions(grad.dtype(), grad.device()));
  else grad.zero_();
  p.set_grad(grad);
}
}  // namespace strata::detail
