// What process_group.cpp and collectives.cpp share: the contiguous working copies the public
// collectives hand to a backend, the step that writes a result back into the caller's tensor,
// and the torch.distributed functions' group default and async_op handling.
#pragma once

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/tensor.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/ops/creation.hpp>

namespace strata::dist::detail {

inline bool is_half(DType d) { return d == kFloat16 || d == kBFloat16; }

// The tensor a backend works on: `t` itself when it is contiguous in `dtype`, else a
// contiguous copy in `dtype` (copied from t when `fill`).
inline Tensor working_copy(const Tensor& t, DType dtype, bool fill) {
  if (t.is_contiguous() && t.dtype() == dtype) return t.detach();
  NoGradGuard no_grad;
  if (!fill) return empty(t.shape(), t.options().dtype(dtype));
  return t.detach().contiguous().to(dtype);
}

// Writes `work` back into `t` unless it is t's own memory, which the backend wrote directly.
inline void write_back(const Tensor& t, const Tensor& work) {
  if (work.storage() == t.storage() && work.data() == t.data()) {
    t.storage()->bump_version();
    return;
  }
  t.detach().copy_(work.view(t.shape()));
}

// The tensors of `list` (of any sizes) laid end to end in one contiguous tensor of `dtype`.
inline Tensor stack_flat(const std::vector<Tensor>& list, DType dtype) {
  int64_t total = 0;
  for (const Tensor& t : list) total += t.numel();
  Tensor stacked = empty({total}, list.front().options().dtype(dtype));
  NoGradGuard no_grad;
  int64_t at = 0;
  for (const Tensor& t : list) {
    stacked.narrow(0, at, t.numel()).view(t.shape()).copy_(t.detach());
    at += t.numel();
  }
  return stacked;
}

// Writes the flat `stacked`, list's tensors laid end to end, back into them.
inline void write_back_chunks(const std::vector<Tensor>& list, const Tensor& stacked) {
  int64_t at = 0;
  for (const Tensor& t : list) {
    write_back(t, stacked.narrow(0, at, t.numel()));
    at += t.numel();
  }
}

inline std::shared_ptr<ProcessGroup> group_or_default(std::shared_ptr<ProcessGroup> group) {
  return group ? group : default_group();
}

// With async_op the Work to wait on; otherwise waits for it and returns null.
inline std::shared_ptr<Work> finish_call(std::shared_ptr<Work> work, bool async_op) {
  if (async_op) return work;
  work->wait();
  return nullptr;
}

}  // namespace strata::dist::detail
