// In-place ops under autograd: Note [In-place under autograd].
#include "autograd/inplace.h"

#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

namespace strata::autograd {

// Note [In-place under autograd]
// An in-place op whose tensors take part in autograd (self or an operand requires grad, grad
// mode on) runs as its out-of-place op, recorded as usual; the result is then copied into
// self's memory without recording, and self takes over the result's history: its grad_fn
// becomes the new node, whose input is self's previous history. So `h.add_(x)` in a forward
// is `h = h + x` for the gradient, as in PyTorch. Refused, each with its reason:
// - a leaf that requires grad (PyTorch refuses it too: its .grad would be for a value that
//   no longer exists); an optimizer's update runs under NoGradGuard;
// - a tensor that shares its memory with another: a view of it or the tensor it views, a
//   detached alias, or a tensor saved for some backward. Their histories would not see the
//   write (PyTorch rewrites a view's base history, CopySlices; here the caller clones first
//   or uses the out-of-place op), and a saved value's backward would fail later; the memory
//   count of self's storage says whether any exists (a value packed by saved-tensor hooks
//   holds no count: a write to it raises at backward instead, SavedTensor::unpack);
// - a tensor that retains its grad, whose hook sits on the history being replaced.
// An op whose backward keeps its input (mul, div, clamp, relu) reads a copy of self, as the
// write would change the saved value (the version check would raise at backward).
Tensor& record_inplace(Tensor& self, const char* op, bool reads_self,
                       const std::function<Tensor(const Tensor& value)>& out_of_place) {
  STRATA_CHECK(!(self.is_leaf() && self.requires_grad()),
               "[{}] in-place op on a leaf tensor that requires grad; run parameter updates under NoGradGuard, or "
               "use the out-of-place op",
               op);
  STRATA_CHECK(self.storage().use_count() == 1,
               "[{}] in-place op under autograd on a tensor whose memory another tensor shares (a view of it or "
               "the tensor it views, a detached alias, or a tensor saved for backward): the other's gradient "
               "would miss the write; clone() it first, or use the out-of-place op",
               op);
  const auto& own = self.impl().autograd;
  STRATA_CHECK(!(own && own->retains_grad),
               "[{}] in-place op under autograd on a tensor that retains its grad; use the out-of-place op", op);
  Tensor result = out_of_place(reads_self ? self.clone() : self);
  STRATA_CHECK(result.shape() == self.shape(), "[{}] internal: result of shape {} for a tensor of shape {}", op,
               result.shape(), self.shape());
  if (result.dtype() != self.dtype()) result = result.to(self.dtype());
  {
    NoGradGuard no_grad;
    self.copy_(result);
  }
  const auto& made = result.impl().autograd;
  if (made && made->grad_fn) {
    set_history(self, made->grad_fn, made->output_nr);
  } else if (own) {  // nothing requiring grad went in: self is a constant now
    own->grad_fn = nullptr;
    own->requires_grad = false;
  }
  return self;
}

}  // namespace strata::autograd

namespace strata::autograd::detail {

Tensor& record_overwrite(Tensor& self, const char* op, const std::function<void(Tensor& out)>& write) {
  return record_inplace(self, op, false, [&](const Tensor& old) {
    Tensor out = empty_like(old);
    write(out);
    // fresh values: the old ones get no gradient
    record(op, {old}, {out}, {}, [](const Grads&, const Saved&) { return Grads{Tensor()}; });
    return out;
  });
}

}  // namespace strata::autograd::detail
