// Fused scaled dot-product attention: one op forward and one backward, never an (L, S) tensor.
//
// Note [Fused attention]
// Composed of matmul and softmax, attention writes the (L, S) scores and the weights to memory
// and reads them back in four more passes (the softmax, the second product, and both again in
// the backward); with a causal mask half of that work is on masked entries. The fused op
// computes blocks of scores that stay in cache (on the GPU, in registers and shared memory),
// runs the softmax on them and multiplies by v at once, keeping only the output and each
// query's logsumexp. The backward recomputes the weights from q, k and that logsumexp, as
// FlashAttention does (kernels/common/attention_math.h has the formulas). Causal blocks stop at
// the last key their last query attends.
//
// It runs when the attention has no mask other than is_causal, q, k and v share their dtype,
// device and batch dims, no dim is empty, and set_fused_attention has not switched it off for
// the device. Dropout of the weights drops what functional::dropout would with the same
// generator, and draws as much from it, so both paths train alike. Anything else takes the
// composed path (src/nn/attention.cpp), which is also what a create_graph backward records, so
// the result can be differentiated again. The CPU kernels are in kernels/cpu/attention.h, the
// CUDA ones in kernels/cuda/attention.cu.
#include <atomic>
#include <cstdint>

#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/attention.h"
#include "nn/attention_internal.h"
#include "ops/dispatch.h"
#include "ops/softmax_internal.h"

namespace strata::nn {

namespace {

// CPU on; CUDA off until its kernels have run on a GPU (docs/gpu.md, "Waiting for a GPU").
std::atomic<bool> fused_enabled[kNumDeviceTypes] = {true, false};

cpu::AttentionDims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, const detail::AttentionParams& p) {
  const int64_t L = q.size(-2), E = q.size(-1);
  return cpu::AttentionDims{q.numel() / (L * E), L, k.size(-2), E, v.size(-1), p.scale, p.causal, p.dropout, p.seed,
                           p.offset};
}

void check_kernel_layout(const KernelCall& call, std::string_view op) {
  for (const Tensor& t : call.inputs)
    STRATA_CHECK(t.is_contiguous() && t.dim() >= 2 && t.numel() > 0,
                 "[{}] kernel needs contiguous, non-empty (..., rows, dim) tensors", op);
}

// inputs (q, k, v); outputs (o (..., L, Ev), lse (batch, L)).
void cpu_attention(const KernelCall& call) {
  check_kernel_layout(call, "attention");
  const auto& p = call.param<detail::AttentionParams>();
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  dispatch<DTypeSet::Floating>(q.dtype(), "attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::attention_forward<T>(static_cast<const T*>(q.data()), static_cast<const T*>(k.data()),
                              static_cast<const T*>(v.data()), static_cast<T*>(call.outputs[0].data()),
                              static_cast<compute_t<T>*>(call.outputs[1].data()), dims_of(q, k, v, p));
  });
}

// inputs (q, k, v, o, grad of o, lse); outputs (gq, gk, gv).
void cpu_attention_backward(const KernelCall& call) {
  check_kernel_layout(call, "attention_backward");
  const auto& p = call.param<detail::AttentionParams>();
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  dispatch<DTypeSet::Floating>(q.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto in = [&](int i) { return static_cast<const T*>(call.inputs[i].data()); };
    auto out = [&](int i) { return static_cast<T*>(call.outputs[i].data()); };
    cpu::attention_backward<T>(in(0), in(1), in(2), in(3), in(4),
                               static_cast<const compute_t<T>*>(call.inputs[5].data()), out(0), out(1), out(2),
                               dims_of(q, k, v, p));
  });
}

// The dropout factors (0 or 1 / (1 - rate)) of the (..., L, S) weights of q (..., L, E) over S
// keys, as a tensor of q's dtype and device (computed on the CPU).
Tensor dropout_factors(const Tensor& q, int64_t keys, const detail::AttentionParams& p) {
  Shape shape = q.shape();
  shape.back() = keys;
  Tensor m = ones(shape, TensorOptions(kFloat64));
  const cpu::AttentionDims dims{.keys = keys, .dropout = p.dropout, .seed = p.seed, .offset = p.offset};
  double* d = static_cast<double*>(m.data());
  for (int64_t r = 0; r < m.numel() / keys; ++r) cpu::detail::attention_dropout_row(d + r * keys, keys, r, dims);
  return m.to(q.dtype()).to(q.device());
}

// The backward as ops, recorded when create_graph asks for a differentiable gradient. delta is
// sum_j p dp here rather than do.o: equal, and it keeps the saved output out of the graph.
autograd::Grads composed_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const detail::AttentionParams& params) {
  const Tensor s = matmul(q, k.transpose(-2, -1)) * params.scale;
  const Tensor p = params.causal ? strata::detail::causal_softmax(s) : softmax(s, -1);
  Tensor pd = p, dp = matmul(g, v.transpose(-2, -1));
  if (params.dropout > 0) {
    const Tensor m = dropout_factors(q, k.size(-2), params);
    pd = p * m, dp = dp * m;
  }
  const Tensor ds = p * (dp - sum(dp * p, {-1}, true));
  return {matmul(ds, k) * params.scale, matmul(ds.transpose(-2, -1), q) * params.scale,
          matmul(pd.transpose(-2, -1), g)};
}

}  // namespace

void functional::set_fused_attention(DeviceType device, bool enabled) {
  fused_enabled[static_cast<int>(device)].store(enabled);
}

bool functional::fused_attention_enabled(DeviceType device) {
  return fused_enabled[static_cast<int>(device)].load();
}

bool detail::fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, double dropout) {
  const DeviceType dev = q.device().type;
  if (!functional::fused_attention_enabled(dev) || !(dropout >= 0 && dropout < 1)) return false;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.device() != q.device() || v.device() != q.device())
    return false;
  if (q.dim() != k.dim() || q.dim() != v.dim() || q.dim() < 2) return false;
  for (int64_t i = 0; i + 2 < q.dim(); ++i)
    if (k.size(i) != q.size(i) || v.size(i) != q.size(i)) return false;
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0 || L == 0 || S == 0 || E == 0 || Ev == 0) return false;
  if (dev == DeviceType::CUDA && (E != Ev || E > kCudaAttentionMaxDim || L > kCudaAttentionMaxRows ||
                                  S > kCudaAttentionMaxRows || q.numel() / (L * E) > INT32_MAX))
    return false;
  return ext::has_kernel(OpId::attention, dev, q.dtype()) && ext::has_kernel(OpId::attention_backward, dev, q.dtype());
}

Tensor detail::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                               double dropout, Generator* gen) {
  AttentionParams p{scale, causal, dropout};
  const int64_t L = q.size(-2), batch = q.numel() / (L * q.size(-1));
  if (dropout > 0) {  // the draw functional::dropout makes over the (batch, L, S) weights
    Generator& g = gen ? *gen : default_generator();
    p.seed = g.seed();
    p.offset = g.reserve((static_cast<uint64_t>(batch * L) * static_cast<uint64_t>(k.size(-2)) + 3) / 4);
  }
  // contiguous copies are made with grad mode on, so that a create_graph backward (composed
  // of these) still reaches q, k and v
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor o, lse;
  {
    NoGradGuard no_grad;
    Shape out_shape = q.shape();
    out_shape.back() = v.size(-1);
    Tensor outs[2] = {strata::detail::make_tensor(out_shape, q.dtype(), q.device()),
                      strata::detail::make_tensor({batch, L}, strata::detail::compute_dtype(q.dtype()), q.device())};
    const Tensor ins[3] = {qc, kc, vc};
    run_kernel(OpId::attention, q.dtype(), KernelCall{ins, outs, &p});
    o = outs[0], lse = outs[1];
  }
  autograd::record("attention", {qc, kc, vc}, {o}, {qc, kc, vc, o, lse},
                   [p](const autograd::Grads& g, const autograd::Saved& s) {
                     if (autograd::is_grad_enabled()) return composed_backward(s[0], s[1], s[2], g[0], p);
                     Tensor outs[3] = {strata::detail::make_tensor(s[0].shape(), s[0].dtype(), s[0].device()),
                                       strata::detail::make_tensor(s[1].shape(), s[1].dtype(), s[1].device()),
                                       strata::detail::make_tensor(s[2].shape(), s[2].dtype(), s[2].device())};
                     const Tensor ins[6] = {s[0], s[1], s[2], s[3], g[0].to(s[0].dtype()).contiguous(), s[4]};
                     run_kernel(OpId::attention_backward, s[0].dtype(), KernelCall{ins, outs, &p});
                     return autograd::Grads{outs[0], outs[1], outs[2]};
                   });
  return o;
}

}  // namespace strata::nn

namespace strata::detail {
void register_attention_kernels(KernelTable& table) {
  table.set(OpId::attention, DeviceType::CPU, kFloatDTypes, nn::cpu_attention);
  table.set(OpId::attention_backward, DeviceType::CPU, kFloatDTypes, nn::cpu_attention_backward);
}
}  // namespace strata::detail
