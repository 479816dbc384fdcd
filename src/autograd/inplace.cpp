// In-place ops under autograd: Note [In-place under autograd].
#include "autograd/inplace.h"

#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

#include "autograd/views.h"
#include "core/tensor_internal.h"

namespace strata::autograd {

// Note [In-place under autograd]
// An in-place op whose tensors take part in autograd (self or an operand requires grad, grad
// mode on) runs as its out-of-place op, recorded as usual; the result is then copied into
// self's memory without recording, and self takes over the result's history: its grad_fn
// becomes the new node, whose input is self's previous history. So `h.add_(x)` in a forward
// is `h = h + x` for the gradient, as in PyTorch. On a view, the tensor it views takes a new
// history too (Note [Views under autograd] in src/autograd/views.cpp), and views of self
// rebuild theirs from self's new one. Other tensors sharing self's memory: a detached alias
// takes no part in autograd; a value saved for some backward raises there, as its version
// moved (SavedTensor::unpack), as in PyTorch. Refused, each with its reason:
// - a leaf that requires grad, or a view of one (PyTorch refuses them too: the .grad would be
//   for a value that no longer exists); an optimizer's update runs under NoGradGuard;
// - an op's output that shares memory with the op's input but has a history of its own (a
//   custom Function returning its input or a view of it), or a view of one: the input's
//   history would miss the write (PyTorch refuses it too);
// - a tensor that does not fill its memory densely while another tensor shares that memory
//   (its views could not rebuild their histories).
// An op whose backward keeps its input (mul, div, clamp, relu) reads a copy of self, as the
// write would change the saved value (the version check would raise at backward). A tensor
// that retains its grad goes on retaining it, for its new value (keep_retaining).
Tensor& record_inplace(Tensor& self, const char* op, bool reads_self,
                       const std::function<Tensor(const Tensor& value)>& out_of_place) {
  STRATA_CHECK(!(self.is_leaf() && self.requires_grad()),
               "[{}] in-place op on a leaf tensor that requires grad; run parameter updates under NoGradGuard, or "
               "use the out-of-place op",
               op);
  const auto& own = self.impl().autograd;
  STRATA_CHECK(!(own && own->aliases_input),
               "[{}] in-place op under autograd on an op's output that shares memory with the op's input (a custom "
               "Function returning its input or a view of it): the input's history would miss the write; clone() "
               "it first",
               op);
  if (Tensor base = detail::base_of(self.impl()); base.defined())
    return detail::record_inplace_on_view(self, base, op, reads_self, out_of_place);
  STRATA_CHECK(self.storage().use_count() == 1 || strata::detail::is_dense(self),
               "[{}] in-place op under autograd on a tensor that does not fill its memory densely (shape {}, strides "
               "{}) while other tensors share that memory; clone() it first",
               op, self.shape(), self.strides());
  Tensor result = detail::compute_and_write(self, self, op, reads_self, out_of_place);
  const bool retained = own && own->retains_grad;
  const auto& made = result.impl().autograd;
  if (made && made->grad_fn) {
    set_history(self, made->grad_fn, made->output_nr);
  } else if (own) {  // nothing requiring grad went in: self is a constant now
    own->grad_fn = nullptr;
    own->requires_grad = false;
  }
  ++self.impl().history_version;  // its views rebuild their histories
  detail::keep_retaining(self, retained);
  return self;
}

}  // namespace strata::autograd

namespace strata::autograd::detail {

Tensor compute_and_write(Tensor& self, const Tensor& value, const char* op, bool reads_self,
                         const std::function<Tensor(const Tensor& value)>& out_of_place) {
  Tensor result = out_of_place(reads_self ? value.clone() : value);
  STRATA_CHECK(result.shape() == self.shape(), "[{}] internal: result of shape {} for a tensor of shape {}", op,
               result.shape(), self.shape());
  if (result.dtype() != self.dtype()) result = result.to(self.dtype());
  NoGradGuard no_grad;
  self.copy_(result);
  return result;
}

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
