// Autocast's per-thread state, its regions and the casts an op's AutocastScope makes, with the
// cache of cast parameters. Which op gets which cast is in autocast_policy.cpp.
#include <strata/amp/autocast.hpp>

#include <unordered_map>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>

namespace strata::amp {

namespace {

struct DeviceState {
  bool enabled = false;
  DType dtype = kBFloat16;
};

// PyTorch's defaults: bfloat16 on the CPU, float16 on CUDA.
thread_local DeviceState t_state[kNumDeviceTypes] = {{false, kBFloat16}, {false, kFloat16}};
thread_local int t_enabled_count = 0;  // device types enabled: the fast path of every op
thread_local int t_nesting = 0;        // open regions of any device type
thread_local int t_inside_op = 0;      // open AutocastScopes that cast, or would have
thread_local int64_t t_casts = 0;

// A parameter cast once in the outermost region and reused until it ends. Keyed by storage, with
// the handle kept to tell views apart and to keep the key alive; a write in place (a new version)
// or a change of grad mode makes the cast stale.
struct CachedCast {
  Tensor source;
  int64_t version;
  bool grad_enabled;
  Tensor cast;
};
thread_local std::unordered_multimap<const Storage*, CachedCast> t_cache;

size_t index_of(DeviceType d) {
  const auto i = static_cast<size_t>(d);
  STRATA_CHECK(i < static_cast<size_t>(kNumDeviceTypes), "[autocast] unknown device type {}", i);
  return i;
}

void set_state(DeviceType device, bool enabled, DType dtype) {
  DeviceState& s = t_state[index_of(device)];
  t_enabled_count += static_cast<int>(enabled) - static_cast<int>(s.enabled);
  s.enabled = enabled;
  s.dtype = dtype;
}

Tensor counted_cast(const Tensor& t, DType dtype) {
  ++t_casts;
  return t.to(dtype);
}

// PyTorch caches only casts of float32 leaves that require grad to the low-precision dtype: the
// weights a model reads at several steps of one forward.
Tensor cached_cast(const Tensor& t, DType dtype) {
  if (dtype == kFloat32 || t.dtype() != kFloat32 || !t.is_leaf() || !t.requires_grad() || t_nesting == 0)
    return counted_cast(t, dtype);
  const bool grad = autograd::is_grad_enabled();
  auto [begin, end] = t_cache.equal_range(t.storage().get());
  for (auto it = begin; it != end; ++it) {
    CachedCast& c = it->second;
    if (!c.source.is_same(t) || c.cast.dtype() != dtype) continue;
    if (c.version == t.version() && c.grad_enabled == grad) return c.cast;
    c = CachedCast{t, t.version(), grad, counted_cast(t, dtype)};
    return c.cast;
  }
  Tensor cast = counted_cast(t, dtype);
  t_cache.emplace(t.storage().get(), CachedCast{t, t.version(), grad, cast});
  return cast;
}

}  // namespace

bool is_autocast_enabled(DeviceType device) { return t_state[index_of(device)].enabled; }

DType autocast_dtype(DeviceType device) { return t_state[index_of(device)].dtype; }

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled) : device_(device) {
  STRATA_CHECK(dtype == kFloat16 || dtype == kBFloat16, "[autocast] dtype must be float16 or bfloat16, got {}",
               dtype);
  const DeviceState& s = t_state[index_of(device)];
  prev_enabled_ = s.enabled;
  prev_dtype_ = s.dtype;
  set_state(device, enabled, dtype);
  ++t_nesting;
}

AutocastGuard::AutocastGuard(DeviceType device, bool enabled)
    : AutocastGuard(device, autocast_dtype(device), enabled) {}

AutocastGuard::~AutocastGuard() {
  set_state(device_, prev_enabled_, prev_dtype_);
  if (--t_nesting == 0) t_cache.clear();
}

namespace detail {

bool AutocastScope::may_cast() { return t_enabled_count > 0 && t_inside_op == 0; }

AutocastScope::AutocastScope(std::string_view op, const std::vector<Tensor>& inputs) {
  if (may_cast()) open(op, inputs.data(), inputs.data() + inputs.size());
}

void AutocastScope::open(std::string_view op, const Tensor* begin, const Tensor* end) {
  const Tensor* first = nullptr;
  for (const Tensor* t = begin; t != end; ++t)
    if (t->defined()) {
      first = t;
      break;
    }
  if (!first) return;
  const DeviceType device = first->device().type;
  const DeviceState& s = t_state[index_of(device)];
  if (!s.enabled) return;
  CastPolicy policy{};
  STRATA_CHECK(policy_of(op, policy), "[autocast] op '{}' is not in the autocast policy table", op);
  const DType target = policy == CastPolicy::LowerPrecision ? s.dtype : kFloat32;
  inputs_.assign(begin, end);
  for (Tensor& t : inputs_) {
    // float64 and integer tensors stay as they are, as in PyTorch
    if (!t.defined() || t.device().type != device || !is_floating(t.dtype()) || t.dtype() == kFloat64 ||
        t.dtype() == target)
      continue;
    t = cached_cast(t, target);
    cast_ = true;
  }
  active_ = true;
  ++t_inside_op;
}

AutocastScope::~AutocastScope() {
  if (active_) --t_inside_op;
}

int64_t cast_count() { return t_casts; }
void reset_cast_count() { t_casts = 0; }
size_t cast_cache_size() { return t_cache.size(); }

}  // namespace detail
}  // namespace strata::amp
