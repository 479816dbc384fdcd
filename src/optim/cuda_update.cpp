// Launchers of the multi-tensor CUDA optimizer kernels (declared in cuda_update.h): batches of
// tensors become arrays of pointers and per-tensor scalars, dispatched on the dtype and
// launched on the device's current stream. Plain C++; the kernels are in kernels/cuda/optim*.cu.
#include "optim/cuda_update.h"

#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>

#include <strata/core/cuda.hpp>
#include <strata/ops/creation.hpp>

#include "kernels/common/quant8.h"
#include "kernels/cuda/optim_ops.h"
#include "ops/cuda/launch.h"
#include "optim/update_util.h"

namespace strata::optim::cuda_update {

namespace {

namespace ck = cuda_kernels::optim;

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

// Every tensor of a batch lives on the first parameter's device. A parameter is dense in its
// layout; a tensor that mirrors it (numel >= 0: its grad, its states) has its length and, when
// shaped like it, its layout, else is contiguous (Note [Parameter layouts] in update_util.h).
void check_tensor(const Tensor& t, const Tensor& p, int64_t numel, const char* op) {
  if (!t.defined()) return;
  const bool laid_out = numel < 0              ? t.is_contiguous(detail::param_format(t))  // a parameter
                        : t.shape() == p.shape() ? t.is_contiguous(detail::param_format(p))  // its grad, states
                                                 : t.is_contiguous();                      // flat codes, scales
  STRATA_CHECK(t.device() == p.device() && (numel < 0 || t.numel() == numel) && laid_out,
               "[{}] a CUDA update got a tensor of shape {} and strides {} on {} for a parameter of shape {} and "
               "strides {} on {}",
               op, t.shape(), t.strides(), t.device(), p.shape(), p.strides(), p.device());
}

template <class Item>
void check_items(const std::vector<Item>& items, const char* op, std::initializer_list<Tensor Item::*> mirrors) {
  const Tensor& first = items.front().p;
  STRATA_CHECK(first.device().is_cuda(), "[{}] the CUDA update got a parameter on {}", op, first.device());
  for (const Item& it : items) {
    STRATA_CHECK(it.p.dtype() == first.dtype(), "[{}] a CUDA update batch mixes {} and {} parameters", op,
                 first.dtype(), it.p.dtype());
    check_tensor(it.p, first, -1, op);
    for (Tensor Item::*m : mirrors) check_tensor(it.*m, it.p, it.p.numel(), op);
  }
}

// Runs f(tag) with T = float or double, the batch's dtype, on the batch's device; f returns
// the entry point's error, raised naming the op.
template <class F>
void launch(const Tensor& p, const char* op, F&& f) {
  cuda::DeviceGuard guard(p.device().index);
  const cudaStream_t stream = cuda_launch::stream_for(p);
  cudaError_t err;
  if (p.dtype() == kFloat64) {
    err = f(static_cast<double*>(nullptr), stream);
  } else {
    STRATA_CHECK(p.dtype() == kFloat32, "[{}] CUDA updates take float32 or float64 parameters, not {}", op,
                 p.dtype());
    err = f(static_cast<float*>(nullptr), stream);
  }
  cuda_launch::check_launch(err, op);
}

// The signed then the unsigned dynamic map of quant8.h, built on the host with the CPU's code
// and copied once to each device; kept for the life of the process.
const float* device_maps(const Device& device) {
  static std::mutex mutex;
  static auto* maps = new std::map<int, Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = maps->find(device.index);
  if (it == maps->end()) {
    Tensor host = empty({2 * quant8::kMapSize}, kFloat32);
    quant8::build_dynamic_map(static_cast<float*>(host.data()), true);
    quant8::build_dynamic_map(static_cast<float*>(host.data()) + quant8::kMapSize, false);
    it = maps->emplace(device.index, host.to(device)).first;  // a blocking copy: complete on return
  }
  return static_cast<const float*>(it->second.data());
}

}  // namespace

void sgd(const std::vector<SgdItem>& items, const math::SgdConsts<double>& c) {
  if (items.empty()) return;
  check_items(items, "SGD", {&SgdItem::g, &SgdItem::buf});
  launch(items[0].p, "SGD", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::SgdTensor<T>> ts;
    for (const SgdItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<T>(it.buf), it.p.numel(), it.first});
    return ck::sgd<T>(ts.data(), static_cast<int64_t>(ts.size()), c, s);
  });
}

bool capturing(const Tensor& param) {
  const int device = param.device().index;
  return cuda::capture_underway(device) && cuda::stream_capturing(cuda::current_stream(device));
}

const double* replay_slot(const Tensor& param, size_t count, std::function<void(double*)> refill, const char* op) {
  return static_cast<const double*>(cuda::graph_replay_slot(
      count * sizeof(double), param.device().index,
      [refill = std::move(refill)](void* out) { refill(static_cast<double*>(out)); }, op));
}

void check_states_exist(const ParamState& st, std::initializer_list<const char*> names, const char* op) {
  for (const char* name : names)
    STRATA_CHECK(st.tensors.count(name), "[{}] the optimizer state '{}' does not exist yet: made inside a CUDA graph "
                 "capture, every replay would reset it; run a step before capture (a warm-up) so it exists", op,
                 name);
}

void check_step_not_captured(const Tensor& param, const char* optimizer) {
  cuda::check_not_capturing(cuda_launch::stream_for(param), optimizer, "this optimizer's step",
                            "its step count lives on the host and a replay would not advance it; capture SGD, Adam "
                            "or AdamW steps, or step this optimizer outside the graph");
}

void adam(const std::vector<AdamItem>& items, const math::AdamConsts<double>& c) {
  if (items.empty()) return;
  check_items(items, "Adam", {&AdamItem::g, &AdamItem::m, &AdamItem::v, &AdamItem::vmax});
  launch(items[0].p, "Adam", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::AdamTensor<T>> ts;
    for (const AdamItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<T>(it.m), ptr<T>(it.v), ptr<T>(it.vmax), it.p.numel(),
                    it.step_size, it.bc2_sqrt, it.corrections});
    return ck::adam<T>(ts.data(), static_cast<int64_t>(ts.size()), c, s);
  });
}

void adagrad(const std::vector<AdagradItem>& items, const math::AdagradConsts<double>& c) {
  if (items.empty()) return;
  check_items(items, "Adagrad", {&AdagradItem::g, &AdagradItem::sum});
  launch(items[0].p, "Adagrad", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::AdagradTensor<T>> ts;
    for (const AdagradItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<T>(it.sum), it.p.numel(), it.clr});
    return ck::adagrad<T>(ts.data(), static_cast<int64_t>(ts.size()), c, s);
  });
}

void rmsprop(const std::vector<RmspropItem>& items, const math::RmspropConsts<double>& c) {
  if (items.empty()) return;
  check_items(items, "RMSprop", {&RmspropItem::g, &RmspropItem::sq, &RmspropItem::gavg, &RmspropItem::buf});
  launch(items[0].p, "RMSprop", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::RmspropTensor<T>> ts;
    for (const RmspropItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<T>(it.sq), ptr<T>(it.gavg), ptr<T>(it.buf), it.p.numel()});
    return ck::rmsprop<T>(ts.data(), static_cast<int64_t>(ts.size()), c, s);
  });
}

Tensor lamb(const std::vector<LambItem>& items, const math::LambConsts<double>& c, double lr, double clamp_min,
            double clamp_max) {
  if (items.empty()) return Tensor();
  check_items(items, "LAMB", {&LambItem::g, &LambItem::m, &LambItem::v});
  const Device device = items[0].p.device();
  int64_t chunks = 0;
  for (const LambItem& it : items) chunks += ck::lamb_num_chunks(it.p.numel());
  // scratch for the per-chunk norms, freed to the stream-ordered cache after the launches
  Tensor partials = empty({2 * chunks}, TensorOptions(kFloat64, device));
  Tensor ratios = empty({static_cast<int64_t>(items.size())}, TensorOptions(kFloat64, device));
  launch(items[0].p, "LAMB", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::LambTensor<T>> ts;
    for (const LambItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<T>(it.m), ptr<T>(it.v), it.p.numel(), it.bc1, it.bc2});
    return ck::lamb<T>(ts.data(), static_cast<int64_t>(ts.size()), c, lr, clamp_min, clamp_max,
                       ptr<double>(partials), ptr<double>(ratios), s);
  });
  return ratios;
}

void adam8bit(const std::vector<Adam8bitItem>& items, int64_t block, const math::AdamConsts<double>& c) {
  if (items.empty()) return;
  check_items(items, "Adam8bit", {&Adam8bitItem::g, &Adam8bitItem::m_codes, &Adam8bitItem::v_codes});
  for (const Adam8bitItem& it : items) {
    const int64_t blocks = (it.p.numel() + block - 1) / block;
    check_tensor(it.m_absmax, it.p, blocks, "Adam8bit");
    check_tensor(it.v_absmax, it.p, blocks, "Adam8bit");
  }
  const float* maps = device_maps(items[0].p.device());
  launch(items[0].p, "Adam8bit", [&](auto* tag, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<ck::Adam8bitTensor<T>> ts;
    for (const Adam8bitItem& it : items)
      ts.push_back({ptr<T>(it.p), ptr<const T>(it.g), ptr<uint8_t>(it.m_codes), ptr<float>(it.m_absmax),
                    ptr<uint8_t>(it.v_codes), ptr<float>(it.v_absmax), it.p.numel(), it.step_size, it.bc2_sqrt});
    return ck::adam8bit<T>(ts.data(), static_cast<int64_t>(ts.size()), block, maps, c, s);
  });
}

}  // namespace strata::optim::cuda_update
