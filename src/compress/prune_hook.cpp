// The forward pre-hook that keeps pruned weights zero (Note [Keeping pruned weights zero] in
// include/strata/compress/prune.hpp): one per pruned module, covering all its masks.
//
// A module cannot carry extra state, so a small table maps each mask buffer to the hook state of
// its module; it holds both weakly, so a destroyed module frees its state and its entries expire.
// The table is what lets pruning a second parameter of a module join the hook already there, and
// remove() drop the hook with the module's last mask. A second registry, also weak, groups the
// masks by the storage of their parameters, so modules that prune one tied weight agree on it.
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/binary.hpp>

#include "compress/prune_internal.h"

namespace strata::compress::detail {

namespace {

// The pruned parameters in one storage and its version right after a hook last multiplied them
// all by their masks. Usually one parameter; more when modules pruning a tied weight share it:
// a hook then applies every mask on the storage, so no module's forward reads entries another
// module's mask prunes, and no hook rewrites a weight another module's forward saved.
struct StorageMasks {
  struct Member {
    std::weak_ptr<TensorImpl> param, mask;
    std::weak_ptr<void> owner;  // the hook state: a destroyed module's masks stop applying
    std::weak_ptr<Storage> mask_storage;
    int64_t mask_version = -1;
  };
  std::mutex mutex;  // the hooks of the modules sharing the storage; held alone or last
  std::weak_ptr<Storage> storage;
  int64_t version = -1;
  std::vector<Member> members;

  // Whether the storage (of `param`, one of the members) or a mask was written since the last
  // application (under mutex).
  bool changed(const Tensor& param) const {
    if (param.version() != version) return true;
    return std::any_of(members.begin(), members.end(), [](const Member& m) {
      const std::shared_ptr<TensorImpl> impl = m.mask.lock();
      if (!impl || m.owner.expired()) return false;
      const Tensor mask(impl);
      return mask.version() != m.mask_version || m.mask_storage.lock() != mask.storage();
    });
  }
  // Multiplies every parameter still in the storage of `param` by its mask (under mutex and
  // no_grad).
  void apply(const Tensor& param) {
    std::erase_if(members, [&](const Member& m) {
      const std::shared_ptr<TensorImpl> p = m.param.lock();
      return !p || m.mask.expired() || m.owner.expired() || p->storage != param.storage();
    });
    for (Member& m : members) {
      const Tensor p(m.param.lock()), mask(m.mask.lock());
      if (mask.shape() == p.shape()) p.mul_(mask);
      m.mask_storage = mask.storage();
      m.mask_version = mask.version();
    }
    version = param.version();
  }
};

std::mutex storages_mutex;  // held alone

// The masks of `param`'s storage, with `param` and `mask` among them.
std::shared_ptr<StorageMasks> join_storage(const Tensor& param, const Tensor& mask, const std::weak_ptr<void>& owner) {
  static std::vector<std::weak_ptr<StorageMasks>> all;
  std::shared_ptr<StorageMasks> found;
  {
    std::lock_guard<std::mutex> lock(storages_mutex);
    std::erase_if(all, [](const std::weak_ptr<StorageMasks>& w) { return w.expired(); });
    for (const std::weak_ptr<StorageMasks>& w : all) {
      std::shared_ptr<StorageMasks> masks = w.lock();
      if (masks && masks->storage.lock() == param.storage()) found = masks;
    }
    if (!found) {
      found = std::make_shared<StorageMasks>();
      found->storage = param.storage();
      all.push_back(found);
    }
  }
  std::lock_guard<std::mutex> lock(found->mutex);
  if (std::none_of(found->members.begin(), found->members.end(),
                   [&](const StorageMasks::Member& m) { return m.mask.lock() == mask.impl_ptr(); }))
    found->members.push_back({param.impl_ptr(), mask.impl_ptr(), owner, {}, -1});
  found->version = -1;  // the new mask applies at the next pass
  return found;
}

// One pruned parameter of a module and the masks of its storage. When nothing changed since the
// last application (no optimizer step, load, move or re-pruning), the hook writes nothing, so
// several forwards before one backward (gradient accumulation) do not modify a weight an earlier
// graph saved.
struct MaskedParameter {
  Tensor param, mask;
  std::shared_ptr<StorageMasks> storage_masks;

  void update(const std::weak_ptr<void>& owner) {
    if (!storage_masks || storage_masks->storage.lock() != param.storage())  // first, or moved
      storage_masks = join_storage(param, mask, owner);
    std::lock_guard<std::mutex> lock(storage_masks->mutex);
    if (storage_masks->changed(param)) storage_masks->apply(param);
  }
  void leave() const {
    if (!storage_masks) return;
    std::lock_guard<std::mutex> lock(storage_masks->mutex);
    std::erase_if(storage_masks->members,
                  [&](const StorageMasks::Member& m) { return m.mask.lock() == mask.impl_ptr(); });
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
      for (MaskedParameter& p : state->params) p.update(state);
    });
  }
  std::lock_guard<std::mutex> guard(state->mutex);
  state->params.push_back({param, mask, nullptr});
  NoGradGuard no_grad;
  state->params.back().update(state);  // set_mask has just multiplied: this writes the same values
  table().push_back({mask.impl_ptr(), state});
}

void detach_mask_hook(const Tensor& mask) {
  std::lock_guard<std::mutex> lock(table_mutex);
  const std::shared_ptr<MaskHookState> state = state_of(mask);
  if (!state) return;
  std::erase_if(table(), [&](const TableEntry& e) { return e.mask.lock() == mask.impl_ptr(); });
  std::lock_guard<std::mutex> guard(state->mutex);
  for (const MaskedParameter& p : state->params)
    if (p.mask.is_same(mask)) p.leave();
  std::erase_if(state->params, [&](const MaskedParameter& p) { return p.mask.is_same(mask); });
  if (state->params.empty()) state->handle.remove();
}

}  // namespace strata::compress::detail
