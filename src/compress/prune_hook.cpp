// The forward pre-hook that keeps pruned weights zero (Note [Keeping pruned weights zero] in
// include/strata/compress/prune.hpp): one per pruned module, covering all its masks.
//
// A module cannot carry extra state, so a small table maps each mask buffer to the hook state of
// its module; it holds both weakly, so a destroyed module frees its state and its entries expire.
// The table is what lets pruning a second parameter of a module join the hook already there, and
// remove() drop the hook with the module's last mask.
#include <memory>
#include <mutex>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/binary.hpp>

#include "compress/prune_internal.h"

namespace strata::compress::detail {

namespace {

// One pruned parameter, and the storage and version of the parameter and mask when the hook last
// multiplied them: when neither changed (no optimizer step, load, or re-pruning since), the hook
// writes nothing, so several forwards before one backward (gradient accumulation) do not modify
// a weight an earlier graph saved.
struct MaskedParameter {
  Tensor param, mask;
  std::weak_ptr<Storage> param_storage, mask_storage;
  int64_t param_version = -1, mask_version = -1;

  bool changed() const {
    return param_storage.lock() != param.storage() || param.version() != param_version ||
           mask_storage.lock() != mask.storage() || mask.version() != mask_version;
  }
  void apply() {
    if (mask.shape() == param.shape()) param.mul_(mask);
    record();
  }
  void record() {
    param_storage = param.storage();
    param_version = param.version();
    mask_storage = mask.storage();
    mask_version = mask.version();
  }
};

struct MaskHookState {
  std::mutex mutex;  // concurrent forwards of one module
  std::vector<MaskedParameter> params;
  nn::RemovableHandle handle;
};

struct TableEntry {
  std::weak_ptr<TensorImpl> mask;
  std::weak_ptr<MaskHookState> state;
};

std::mutex table_mutex;
std::vector<TableEntry>& table() {
  static std::vector<TableEntry> entries;
  return entries;
}

// The live state of `mask`'s module, or null; drops expired entries on the way. Needs table_mutex.
std::shared_ptr<MaskHookState> state_of(const Tensor& mask) {
  auto& entries = table();
  std::erase_if(entries, [](const TableEntry& e) { return e.mask.expired() || e.state.expired(); });
  for (const TableEntry& e : entries)
    if (e.mask.lock() == mask.impl_ptr()) return e.state.lock();
  return nullptr;
}

}  // namespace

void attach_mask_hook(nn::Module& module, const Tensor& param, const Tensor& mask) {
  std::lock_guard<std::mutex> lock(table_mutex);
  std::shared_ptr<MaskHookState> state;
  for (auto& [name, buffer] : module.named_buffers(false))  // another mask of this module has the hook
    if (!buffer.is_same(mask) && (state = state_of(buffer))) break;
  if (!state) {
    state = std::make_shared<MaskHookState>();
    // The hook owns the state; the state holds the module's tensors and a weak handle, not the
    // module, so nothing forms a cycle.
    state->handle = module.register_forward_pre_hook([state](nn::Module&, const Tensor&) {
      std::lock_guard<std::mutex> guard(state->mutex);
      NoGradGuard no_grad;
      for (MaskedParameter& p : state->params)
        if (p.changed()) p.apply();
    });
  }
  std::lock_guard<std::mutex> guard(state->mutex);
  state->params.push_back({param, mask, {}, {}});
  state->params.back().record();  // set_mask has just multiplied
  table().push_back({mask.impl_ptr(), state});
}

void detach_mask_hook(const Tensor& mask) {
  std::lock_guard<std::mutex> lock(table_mutex);
  const std::shared_ptr<MaskHookState> state = state_of(mask);
  if (!state) return;
  std::erase_if(table(), [&](const TableEntry& e) { return e.mask.lock() == mask.impl_ptr(); });
  std::lock_guard<std::mutex> guard(state->mutex);
  std::erase_if(state->params, [&](const MaskedParameter& p) { return p.mask.is_same(mask); });
  if (state->params.empty()) state->handle.remove();
}

}  // namespace strata::compress::detail
