// Views and in-place ops under autograd: Note [Views under autograd].
#include "autograd/views.h"

#include "autograd/inplace.h"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>

#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

#include "core/tensor_internal.h"

namespace strata::autograd::detail {

// Note [Views under autograd]
// A view and its base share memory, so an in-place write to one changes the other, and each
// one's history must say so, as in PyTorch:
// - A view op (and split/chunk, for their parts) keeps the view's base (the first tensor of a
//   chain of views) in TensorImpl::view_base, with the base's history_version its own history
//   is of; made with grad mode off, weakly (view_base_without_grad), so that a view kept for a
//   metric keeps no graph alive. An op that makes its output as a view of a buffer of its own
//   and records a history for it has record() forget the base (mark_output): the buffer has no
//   part in it. An output sharing its input's memory with a history of its own (a custom
//   Function returning its input or a view of it) is marked aliases_input, and in-place ops
//   under autograd refuse it and its views, as PyTorch does: its input would miss the write.
// - An in-place op under autograd on a view whose base lives (record_inplace_on_view)
//   computes its result from the view's current values, recorded as a strided view of the
//   base's history; writes it into the view; and gives the base a new history, "copy_slices":
//   the old base with the view's elements replaced by the result. Its backward hands the old
//   base the gradient with those elements zeroed and the result the gradient's elements at the
//   view. The view's own history becomes a strided view of the new one. Both are written with
//   strata ops, so double backward runs through them (the zeroing is itself an in-place op on
//   a view). The op runs under autograd when its base requires grad even if nothing else does
//   (inplace_records): a view made with grad mode off, or before its base required grad, has
//   no history of its own. PyTorch refuses a view made with grad mode off here; its gradient is
//   as right as any other's, so strata takes it.
// - Any in-place op under autograd bumps the history_version of the tensor whose history it
//   replaced; a view whose base moved on rebuilds its history as a strided view of the base's
//   current one when next asked (refresh_view, in requires_grad(), grad_fn(), is_leaf() and
//   gradient_edge(); once, under a lock, when several threads ask). So `v = h[0]; h.mul_(2)`
//   gives v the doubled values' history too. A retained grad moves to the new history. A view
//   made with grad mode off has no history to rebuild: used with grad mode on after such a
//   write, it raises (check_view_without_grad), as in PyTorch, rather than hold the new values
//   with no gradient.
// Strided views of the base go through the base permuted to a contiguous order, which takes a
// base that fills its memory densely in any dim order (every tensor an op makes); an in-place
// op under autograd on a view of any other base is refused, as is one on such a base while
// another tensor shares its memory.
// An op's output marked aliases_input is linked to its input's memory the same way, and raises
// when used after a write to it, as PyTorch does. Views whose elements overlap (expanded) are
// rebuilt as a strided view of the elements once, expanded.
// As in PyTorch, a graph that saves a view of a tensor and then becomes that tensor's history
// (`h.add_(h[0] * w)`: mul saves h[0], which holds h) is a reference cycle that outlives the
// tensors (its backward raises, as the saved h[0] changed); code that never runs backward
// should run under NoGradGuard.

namespace {

// The dim order that makes t contiguous, when t fills its memory densely; else nullopt.
std::optional<std::vector<int64_t>> dense_order(const Tensor& t) {
  std::vector<int64_t> order(static_cast<size_t>(t.dim()));
  std::iota(order.begin(), order.end(), 0);
  if (t.is_contiguous()) return order;
  if (!strata::detail::is_dense(t)) return std::nullopt;
  // dense: the dims by falling stride are contiguous (no permuted tensor made, or recorded)
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

bool is_identity(const std::vector<int64_t>& order) {
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] != static_cast<int64_t>(i)) return false;
  return true;
}

std::vector<int64_t> inverse_of(const std::vector<int64_t>& order) {
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return inverse;
}

// The elements of `base` that `view` looks at, as a view of base recorded by as_strided (and
// expand, for the dims an expanded view repeats).
Tensor view_of_base(const Tensor& base, const std::vector<int64_t>& order, const TensorImpl& view) {
  Tensor contiguous = is_identity(order) ? base : base.permute(order);
  Shape once = view.shape;
  for (size_t d = 0; d < once.size(); ++d)
    if (view.strides[d] == 0) once[d] = std::min<int64_t>(once[d], 1);
  Tensor part = contiguous.as_strided(once, view.strides, view.offset);
  return once == view.shape ? part : part.expand(view.shape);
}

}  // namespace

void track_view(const Tensor& x, const Tensor& view) {
  Tensor root = base_of(x.impl());
  const std::shared_ptr<TensorImpl>& base = root.defined() ? root.impl_ptr() : x.impl_ptr();
  TensorImpl& v = view.impl();
  // record() marked the view as sharing x's memory; it is a view, unless x is such an output
  const bool inherits = x.impl().autograd && x.impl().autograd->aliases_input;
  if (v.autograd) v.autograd->aliases_input = inherits;
  v.base_history_version.store(base->history_version.load());
  v.view_without_grad = !is_grad_enabled();
  if (v.view_without_grad) {
    v.view_base_without_grad = base;
    return;
  }
  v.view_base = base;
  v.view_base_without_grad.reset();
}

void check_view_without_grad(const Tensor& view) {
  if (!is_grad_enabled()) return;
  const TensorImpl& v = view.impl();
  std::shared_ptr<TensorImpl> base = v.view_base_without_grad.lock();
  if (!base || base->storage != v.storage || base->history_version.load() == v.base_history_version.load()) return;
  STRATA_CHECK(!(base->autograd && base->autograd->requires_grad),
               "[autograd] a view made with grad mode off (under NoGradGuard) is used with grad mode on after the "
               "tensor it views was modified in place under autograd: it holds the new values but no history of "
               "them. Make the view with grad mode on, or take it again after the write");
}

void mark_output(const Tensor& out, const std::vector<Tensor>& inputs) {
  TensorImpl& o = out.impl();
  forget_view(o);
  for (const Tensor& in : inputs) {
    if (!in.defined() || in.storage() != o.storage) continue;
    if (!o.autograd) o.autograd = std::make_shared<AutogradMeta>();
    o.autograd->aliases_input = true;
    // linked to the input's memory, so that a later write to it makes this output raise
    Tensor root = base_of(in.impl());
    o.view_base = root.defined() ? root.impl_ptr() : in.impl_ptr();
    o.base_history_version.store(o.view_base->history_version.load());
    return;
  }
}

bool inplace_records(const Tensor& self, std::initializer_list<const Tensor*> operands) {
  if (!is_grad_enabled()) return false;
  if (self.requires_grad()) return true;
  for (const Tensor* t : operands)
    if (t->defined() && t->requires_grad()) return true;
  Tensor base = base_of(self.impl());
  return base.defined() && base.requires_grad();
}

void keep_retaining(const Tensor& t, bool retained) {
  auto& meta = t.impl().autograd;
  if (!retained || !meta) return;
  meta->retains_grad = false;  // the hook on the old history is spent (Tensor::retain_grad)
  if (meta->grad_fn) t.retain_grad();
}

Tensor base_of(const TensorImpl& t) {
  std::shared_ptr<TensorImpl> base = t.view_base ? t.view_base : t.view_base_without_grad.lock();
  if (!base || base->storage != t.storage) return Tensor();
  return Tensor(std::move(base));
}

void rebuild_view_history(const Tensor& view) {
  // Queries of one view from several threads (a model run by several) rebuild it once: the
  // others wait here, and the version is stored (release) only once the history is whole.
  // Recursive, as the ops below query their inputs' histories.
  static std::recursive_mutex rebuilding;
  std::lock_guard<std::recursive_mutex> lock(rebuilding);
  TensorImpl& v = view.impl();
  const uint64_t now = v.view_base->history_version.load();
  if (v.base_history_version.load() == now) return;  // another thread did it
  auto stamp = [&] { v.base_history_version.store(now, std::memory_order_release); };
  if (v.view_base->storage != v.storage) return stamp();
  auto& own = v.autograd;
  STRATA_CHECK(!(own && own->aliases_input),
               "[autograd] an op's output that shares memory with the op's input (a custom Function returning "
               "its input or a view of it) is used after that input was modified in place under autograd; its "
               "history would be for the old values: clone() the output before the write");
  if (own && own->requires_grad && !own->grad_fn) return stamp();  // a leaf the user made: it stays one
  Tensor base(v.view_base);
  auto order = dense_order(base);
  if (!order) return stamp();  // in-place ops under autograd refuse such bases while they have views
  Tensor fresh;
  {
    EnableGradGuard grad_mode;  // the history is the view's whatever the caller's mode
    fresh = view_of_base(base, *order, v);
  }
  const bool retained = own && own->retains_grad;
  if (fresh.requires_grad()) {
    set_history(view, fresh.grad_fn(), fresh.impl().autograd->output_nr);
  } else if (own) {
    own->grad_fn = nullptr;
    own->requires_grad = false;
  }
  stamp();  // before retain_grad, which asks for the view's history again
  keep_retaining(view, retained);
}

Tensor& record_inplace_on_view(Tensor& self, const Tensor& base, const char* op, bool reads_self,
                               const std::function<Tensor(const Tensor& value)>& out_of_place) {
  TensorImpl& v = self.impl();
  STRATA_CHECK(!(base.is_leaf() && base.requires_grad()),
               "[{}] in-place op on a view of a leaf tensor that requires grad; run parameter updates under "
               "NoGradGuard, or use the out-of-place op",
               op);
  const auto& base_meta = base.impl().autograd;
  STRATA_CHECK(!strata::detail::elements_share_memory(self),
               "[{}] in-place op on a view whose elements share memory (an expanded view of shape {} and strides {})",
               op, self.shape(), self.strides());
  auto order = dense_order(base);
  STRATA_CHECK(order.has_value(),
               "[{}] in-place op under autograd on a view of a tensor that does not fill its memory densely "
               "(shape {}, strides {}); clone() the view, or the tensor it views, first",
               op, base.shape(), base.strides());

  Tensor old = view_of_base(base, *order, v);
  forget_view(old.impl());  // a temporary: nothing it is saved in should hold the base
  Tensor result = compute_and_write(self, old, op, reads_self, out_of_place);
  const std::vector<int64_t> inverse = inverse_of(*order);
  Shape contiguous_shape;
  for (int64_t d : *order) contiguous_shape.push_back(base.size(d));
  const Shape shape = v.shape;
  const Strides strides = v.strides;
  const int64_t at = v.offset - base.storage_offset();
  record("copy_slices", {base, result}, {base}, {},
         [order = *order, inverse, contiguous_shape, shape, strides, at](const Grads& g, const Saved&) {
           Tensor grad = empty(contiguous_shape, TensorOptions(g[0].dtype(), g[0].device()));
           grad.copy_(g[0].permute(order));
           Tensor region = grad.as_strided(shape, strides, at);
           Tensor for_result = region.clone();
           region.zero_();  // the values the write replaced get no gradient
           return Grads{grad.permute(inverse), for_result};
         });
  ++base.impl().history_version;
  keep_retaining(base, base_meta && base_meta->retains_grad);
  v.view_base = base.impl_ptr();  // a view made with grad mode off is one of the graph's now
  v.view_base_without_grad.reset();
  v.view_without_grad = false;
  rebuild_view_history(self);
  return self;
}

}  // namespace strata::autograd::detail
