// Library-internal parts of Note [Views under autograd] (src/autograd/views.cpp).
#pragma once

#include <functional>
#include <initializer_list>

#include <strata/core/tensor.hpp>

namespace strata::autograd::detail {

/// Marks `view`, just made (and recorded) by a view op from `x`, as a view of x's base, or of
/// x when x is no view: strongly with grad mode on, weakly with it off.
void track_view(const Tensor& x, const Tensor& view);

/// An op's output that it made as a view of a buffer of its own but gave a history of its own
/// (record() calls this for every output) is no view for autograd: its base has no part in it.
inline void forget_view(TensorImpl& t) {
  t.view_base.reset();
  t.view_base_without_grad.reset();
  t.view_without_grad = false;
}

/// Whether an in-place op on self with these operands runs under autograd (record_inplace):
/// grad mode is on and self or an operand requires grad, or self views a tensor that does (a
/// view made with grad mode off, or before its base needed grad, requires none itself).
bool inplace_records(const Tensor& self, std::initializer_list<const Tensor*> operands = {});

/// After an in-place op under autograd gave t a new history: t retains its grad again if it
/// did (`retained`), on the new history (the hook on the old one no longer fires).
void keep_retaining(const Tensor& t, bool retained);

/// The tensor whose memory `t` views, when t is a view and that tensor still lives and holds
/// the memory (set_data can move it); else an undefined tensor.
Tensor base_of(const TensorImpl& t);

/// Gives a view whose base's history changed since its own was made a history of its base's
/// current one (a strided view of it). Called by every query of a view's history. Raises for an
/// op's output marked aliases_input, whose own history the write made wrong.
void rebuild_view_history(const Tensor& view);

/// Raises for a view made with grad mode off whose base was since written under autograd,
/// when grad mode is on: it has the new values and no history of them, as PyTorch refuses.
void check_view_without_grad(const Tensor& view);

inline void refresh_view(const Tensor& t) {
  const TensorImpl& impl = t.impl();
  if (impl.view_base) {
    if (impl.base_history_version.load(std::memory_order_acquire) !=
        impl.view_base->history_version.load(std::memory_order_acquire)) [[unlikely]]
      rebuild_view_history(t);
  } else if (impl.view_without_grad) [[unlikely]] {
    check_view_without_grad(t);
  }
}

/// record_inplace for a view of `base`: the op's result is written into the view, and the base
/// takes a history that puts it there (PyTorch's CopySlices); the view's history becomes a view
/// of that, and the base's other views rebuild theirs when next asked.
Tensor& record_inplace_on_view(Tensor& self, const Tensor& base, const char* op, bool reads_self,
                               const std::function<Tensor(const Tensor& value)>& out_of_place);

}  // namespace strata::autograd::detail
