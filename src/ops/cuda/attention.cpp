// CUDA launchers of fused attention (attention and attention_backward, Note [Fused attention]
// in src/nn/attention_fused.cpp): the same inputs, outputs and AttentionParams as the CPU
// kernels there, launched on the current stream of the tensors' device. The kernels are in
// kernels/cuda/attention.cu.
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "core/cuda/check.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cuda/attention_ops.h"
#include "nn/attention_internal.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

static_assert(nn::detail::kCudaAttentionMaxDim == ck::kMaxAttentionDim);
static_assert(nn::detail::kCudaAttentionMaxRows == ck::kMaxAttentionRows);

ck::AttentionDropout dropout_of(const nn::detail::AttentionParams& p) {
  if (p.dropout <= 0) return {};
  return {static_cast<float>(p.dropout), static_cast<float>(1.0 / (1.0 - p.dropout)), p.seed, p.offset};
}

// (batch, L, S, D) of q (..., L, D), k and v (..., S, D), and where every tensor keeps its rows.
struct Dims {
  int64_t batch, L, S, D;
  math::AttentionLayout layout;
};

Dims check_layout(const KernelCall& call, std::string_view op) {
  const math::AttentionLayout layout = nn::detail::attention_layout(call, op);
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  const int64_t L = q.size(-2), S = k.size(-2), D = q.size(-1);
  STRATA_CHECK(k.size(-1) == D && v.size(-1) == D && v.size(-2) == S && D <= ck::kMaxAttentionDim && L > 0 &&
                   S > 0 && D > 0 && L <= ck::kMaxAttentionRows && S <= ck::kMaxAttentionRows,
               "[{}] CUDA kernel needs one head dim of 1 to {} for q, k and v and 1 to {} queries and keys, "
               "got q {}, k {}, v {}",
               op, ck::kMaxAttentionDim, ck::kMaxAttentionRows, q.shape(), k.shape(), v.shape());
  return {L * D == 0 ? 0 : q.numel() / (L * D), L, S, D, layout};
}

// inputs (q, k, v); outputs (o, lse (batch, L) float).
void cuda_attention(const KernelCall& call) {
  const Dims d = check_layout(call, "attention");
  const auto& p = call.param<nn::detail::AttentionParams>();
  const Tensor& q = call.inputs[0];
  cuda::DeviceGuard guard(q.device().index);
  if (p.dropout > 0) cuda_launch::check_random_not_captured(cuda_launch::stream_for(q), "attention");
  dispatch<DTypeSet::Floating>(q.dtype(), "attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      STRATA_CHECK(false, "[attention] the CUDA kernel takes float16, bfloat16 and float32, not float64");
    } else {
      auto in = [&](int i) { return static_cast<const T*>(call.inputs[i].data()); };
      cuda_launch::check_launch(ck::attention_forward<T>(cuda_launch::stream_for(q), in(0), in(1), in(2),
                                                         static_cast<T*>(call.outputs[0].data()),
                                                         static_cast<float*>(call.outputs[1].data()), d.batch, d.L,
                                                         d.S, d.D, p.scale, p.causal, dropout_of(p), d.layout),
                                "attention");
    }
  });
}

// inputs (q, k, v, o, grad of o, lse); outputs (gq, gk, gv).
void cuda_attention_backward(const KernelCall& call) {
  const Dims d = check_layout(call, "attention_backward");
  const auto& p = call.param<nn::detail::AttentionParams>();
  const Tensor& q = call.inputs[0];
  cuda::DeviceGuard guard(q.device().index);
  Tensor delta = detail::make_tensor({d.batch * d.L}, kFloat32, q.device());
  dispatch<DTypeSet::Floating>(q.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      STRATA_CHECK(false, "[attention_backward] the CUDA kernel takes float16, bfloat16 and float32, not float64");
    } else {
      auto in = [&](int i) { return static_cast<const T*>(call.inputs[i].data()); };
      auto out = [&](int i) { return static_cast<T*>(call.outputs[i].data()); };
      cuda_launch::check_launch(
          ck::attention_backward<T>(cuda_launch::stream_for(q), in(0), in(1), in(2), in(3), in(4),
                                    static_cast<const float*>(call.inputs[5].data()), static_cast<float*>(delta.data()),
                                    out(0), out(1), out(2), d.batch, d.L, d.S, d.D, p.scale, p.causal,
                                    dropout_of(p), d.layout),
          "attention_backward");
    }
  });
}

}  // namespace

// The opt-in limit is read once per device: it is fixed for the process's life.
bool nn::detail::cuda_attention_fits(int device, int64_t head_dim) {
  static std::mutex mutex;
  static std::unordered_map<int, int64_t> optin_bytes;
  int64_t limit = 0;
  {
    std::lock_guard lock(mutex);
    auto it = optin_bytes.find(device);
    if (it == optin_bytes.end()) {
      int bytes = 0;
      STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                        "scaled_dot_product_attention");
      it = optin_bytes.emplace(device, bytes).first;
    }
    limit = it->second;
  }
  const size_t need = ck::attention_shared_bytes(head_dim);
  return need > 0 && need <= static_cast<size_t>(limit);
}

namespace detail {
void register_cuda_attention_kernels(KernelTable& table) {
  table.set(OpId::attention, DeviceType::CUDA, {kFloat16, kBFloat16, kFloat32}, cuda_attention);
  table.set(OpId::attention_backward, DeviceType::CUDA, {kFloat16, kBFloat16, kFloat32}, cuda_attention_backward);
}
}  // namespace detail

}  // namespace strata
