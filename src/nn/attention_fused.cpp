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
// The kernels read q, k, v and the output's gradient in place when their columns are adjacent
// and their batch dims fold into two strided dims (math::AttentionRows), as the heads of a
// split qkv projection do. The output and the gradients of q, k and v are laid out as q, k and
// v are: with the heads inside the rows ((batch, L, heads, dim) in memory, as such heads are),
// the output's transpose(1, 2).reshape(batch, L, width) needs no copy, and neither do the
// gradients on their way back to the projection.
//
// It runs when the attention has no mask other than is_causal, q, k and v share their dtype
// and device, no dim is empty, and set_fused_attention has not switched it off for the device.
// Batch dims that broadcast (keys and values shared by the heads) become expanded views, which
// the kernels read in place and whose backward sums the gradients back. Dropout of the weights
// drops what functional::dropout would with the same generator, and draws as much from it, so
// both paths train alike. Anything else takes the composed path (src/nn/attention.cpp), which
// is also what a create_graph backward records, so the result can be differentiated again. The
// CPU kernels are in kernels/cpu/attention.h, the CUDA ones in kernels/cuda/attention.cu.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

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

// inputs (q, k, v); outputs (o (..., L, Ev), lse (batch, L)).
void cpu_attention(const KernelCall& call) {
  const math::AttentionLayout layout = detail::attention_layout(call, "attention");
  const auto& p = call.param<detail::AttentionParams>();
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  dispatch<DTypeSet::Floating>(q.dtype(), "attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::attention_forward<T>(static_cast<const T*>(q.data()), static_cast<const T*>(k.data()),
                              static_cast<const T*>(v.data()), static_cast<T*>(call.outputs[0].data()),
                              static_cast<compute_t<T>*>(call.outputs[1].data()), dims_of(q, k, v, p), layout);
  });
}

// inputs (q, k, v, o, grad of o, lse); outputs (gq, gk, gv).
void cpu_attention_backward(const KernelCall& call) {
  const math::AttentionLayout layout = detail::attention_layout(call, "attention_backward");
  const auto& p = call.param<detail::AttentionParams>();
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  dispatch<DTypeSet::Floating>(q.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto in = [&](int i) { return static_cast<const T*>(call.inputs[i].data()); };
    auto out = [&](int i) { return static_cast<T*>(call.outputs[i].data()); };
    cpu::attention_backward<T>(in(0), in(1), in(2), in(3), in(4),
                               static_cast<const compute_t<T>*>(call.inputs[5].data()), out(0), out(1), out(2),
                               dims_of(q, k, v, p), layout);
  });
}

// A new tensor of like's shape with `cols` columns, laid out as like is: when like keeps its
// dim -3 inside its rows (the heads of a (batch, L, heads, dim) projection), as (..., L, H,
// cols) transposed to (..., H, L, cols); else contiguous.
Tensor new_rows_like(const Tensor& like, int64_t cols) {
  Shape shape = like.shape();
  shape.back() = cols;
  const size_t n = shape.size();
  if (n >= 3 && like.size(-3) > 1 && like.size(-2) > 1 && like.stride(-3) < like.stride(-2)) {
    std::swap(shape[n - 3], shape[n - 2]);
    return strata::detail::make_tensor(shape, like.dtype(), like.device()).transpose(-3, -2);
  }
  return strata::detail::make_tensor(shape, like.dtype(), like.device());
}

// The batch dims q, k and v broadcast to, or nullopt.
std::optional<Shape> common_batch(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t n = std::max({q.dim(), k.dim(), v.dim()}) - 2;
  Shape batch(static_cast<size_t>(std::max<int64_t>(n, 0)), 1);
  for (const Tensor* t : {&q, &k, &v})
    for (int64_t i = 0; i + 2 < t->dim(); ++i) {
      const int64_t size = t->size(i);
      int64_t& b = batch[static_cast<size_t>(n - (t->dim() - 2) + i)];
      if (size != 1 && b != 1 && size != b) return std::nullopt;
      if (size != 1) b = size;
    }
  return batch;
}

// t with the batch dims `batch` (an expanded view when they differ).
Tensor with_batch(const Tensor& t, Shape batch) {
  batch.push_back(t.size(-2));
  batch.push_back(t.size(-1));
  return batch == t.shape() ? t : t.expand(batch);
}

// t itself when the kernels can read it in place, else a contiguous copy (made with grad mode
// as it is, so that a create_graph backward, composed of ops, still reaches t).
Tensor readable(const Tensor& t) { return detail::attention_rows(t) ? t : t.contiguous(); }

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

std::optional<math::AttentionRows> detail::attention_rows(const Tensor& t) {
  const int64_t n = t.dim();
  if (n < 2 || (t.size(-1) > 1 && t.stride(-1) != 1)) return std::nullopt;
  if (t.size(-2) > 1 && t.stride(-2) < t.size(-1)) return std::nullopt;  // rows overlap: no GEMM reads them
  // fold the batch dims, innermost first, into (size, stride) groups; dims of size 1 have no say
  int64_t sizes[2] = {1, 1}, strides[2] = {0, 0};
  int groups = 0;
  for (int64_t i = n - 3; i >= 0; --i) {
    const int64_t size = t.size(i), stride = t.stride(i);
    if (size == 1) continue;
    if (groups > 0 && stride == strides[groups - 1] * sizes[groups - 1]) {
      sizes[groups - 1] *= size;
    } else {
      if (groups == 2) return std::nullopt;
      sizes[groups] = size, strides[groups] = stride, ++groups;
    }
  }
  return math::AttentionRows{sizes[0], strides[1], strides[0], t.size(-2) > 1 ? t.stride(-2) : t.size(-1)};
}

namespace {
// The kernels index every tensor by q's problem count and k's rows: the shapes must agree.
bool sizes_agree(const KernelCall& call, bool backward) {
  const Tensor &q = call.inputs[0], &k = call.inputs[1], &v = call.inputs[2];
  if (!q.defined() || !k.defined() || !v.defined() || q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim())
    return false;
  Shape o_shape = q.shape();
  o_shape.back() = v.size(-1);
  for (int64_t i = 0; i + 2 < q.dim(); ++i)
    if (k.size(i) != q.size(i) || v.size(i) != q.size(i)) return false;
  auto is = [](const Tensor& t, const Shape& shape) { return t.defined() && t.shape() == shape; };
  const Tensor& lse = backward ? call.inputs[5] : call.outputs[1];
  const int64_t rows = q.size(-1) == 0 ? 0 : q.numel() / q.size(-1);
  if (k.size(-1) != q.size(-1) || v.size(-2) != k.size(-2) || lse.numel() != rows) return false;
  if (!backward) return is(call.outputs[0], o_shape);
  return is(call.inputs[3], o_shape) && is(call.inputs[4], o_shape) && is(call.outputs[0], q.shape()) &&
         is(call.outputs[1], k.shape()) && is(call.outputs[2], v.shape());
}
}  // namespace

math::AttentionLayout detail::attention_layout(const KernelCall& call, std::string_view op) {
  auto rows = [&](const Tensor& t) {
    const std::optional<math::AttentionRows> r = t.defined() ? attention_rows(t) : std::nullopt;
    STRATA_CHECK(r && t.numel() > 0,
                 "[{}] kernel needs non-empty (..., rows, dim) tensors with adjacent columns, rows at least a row "
                 "apart and batch dims that fold into two strided dims, got shape {} and strides {}",
                 op, t.defined() ? t.shape() : Shape{}, t.defined() ? t.strides() : Strides{});
    return *r;
  };
  const bool backward = call.inputs.size() == 6;
  STRATA_CHECK(call.inputs.size() == (backward ? 6u : 3u) && call.outputs.size() == (backward ? 3u : 2u),
               "[{}] kernel takes 3 inputs and 2 outputs (forward) or 6 and 3 (backward)", op);
  const Tensor& lse = backward ? call.inputs[5] : call.outputs[1];
  STRATA_CHECK(lse.defined() && lse.is_contiguous(), "[{}] kernel needs a contiguous logsumexp", op);
  STRATA_CHECK(sizes_agree(call, backward), "[{}] kernel needs q (..., L, E), k (..., S, E), v (..., S, Ev) of the "
               "same batch dims, outputs and gradients of the matching shapes and a logsumexp of (..., L); got q {}, "
               "k {}, v {}, logsumexp {}", op, call.inputs[0].shape(), call.inputs[1].shape(), call.inputs[2].shape(),
               lse.shape());
  math::AttentionLayout l;
  l.q = rows(call.inputs[0]), l.k = rows(call.inputs[1]), l.v = rows(call.inputs[2]);
  if (!backward) {
    l.o = rows(call.outputs[0]);
    return l;
  }
  l.o = rows(call.inputs[3]), l.go = rows(call.inputs[4]);
  l.gq = rows(call.outputs[0]), l.gk = rows(call.outputs[1]), l.gv = rows(call.outputs[2]);
  return l;
}

bool detail::fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, double dropout) {
  const DeviceType dev = q.device().type;
  if (!functional::fused_attention_enabled(dev) || !(dropout >= 0 && dropout < 1)) return false;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.device() != q.device() || v.device() != q.device())
    return false;
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2) return false;
  const std::optional<Shape> batch = common_batch(q, k, v);
  if (!batch || q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return false;
  const int64_t problems = checked_numel(*batch, "scaled_dot_product_attention");
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  if (dev == DeviceType::CUDA && (E != Ev || E > kCudaAttentionMaxDim || L > kCudaAttentionMaxRows ||
                                  S > kCudaAttentionMaxRows || problems > INT32_MAX ||
                                  !cuda_attention_fits(q.device().index, E)))
    return false;
  return ext::has_kernel(OpId::attention, dev, q.dtype()) && ext::has_kernel(OpId::attention_backward, dev, q.dtype());
}

Tensor detail::fused_attention(const Tensor& query, const Tensor& key, const Tensor& value, double scale, bool causal,
                               double dropout, Generator* gen) {
  const std::optional<Shape> common = common_batch(query, key, value);
  STRATA_CHECK(common,
               "[scaled_dot_product_attention] the batch dims of query {}, key {} and value {} do not broadcast",
               query.shape(), key.shape(), value.shape());
  const Tensor q = with_batch(query, *common), k = with_batch(key, *common), v = with_batch(value, *common);
  AttentionParams p{scale, causal, dropout};
  const int64_t L = q.size(-2), batch = checked_numel(*common, "scaled_dot_product_attention");
  if (dropout > 0) {  // the draw functional::dropout makes over the (batch, L, S) weights
    Generator& g = gen ? *gen : default_generator();
    const uint64_t weights = static_cast<uint64_t>(batch * L) * static_cast<uint64_t>(k.size(-2));
    const RandomDraw draw = g.reserve_draw((weights + 3) / 4);
    p.seed = draw.seed;
    p.offset = draw.offset;
  }
  const Tensor qc = readable(q), kc = readable(k), vc = readable(v);  // copies only where the kernels cannot read
  Tensor o, lse;
  {
    NoGradGuard no_grad;
    Tensor outs[2] = {new_rows_like(qc, v.size(-1)),
                      strata::detail::make_tensor({batch, L}, strata::detail::compute_dtype(q.dtype()), q.device())};
    const Tensor ins[3] = {qc, kc, vc};
    run_kernel(OpId::attention, q.dtype(), KernelCall{ins, outs, &p});
    o = outs[0], lse = outs[1];
  }
  autograd::record("attention", {qc, kc, vc}, {o}, {qc, kc, vc, o, lse},
                   [p](const autograd::Grads& g, const autograd::Saved& s) {
                     if (autograd::is_grad_enabled()) return composed_backward(s[0], s[1], s[2], g[0], p);
                     Tensor outs[3] = {new_rows_like(s[0], s[0].size(-1)), new_rows_like(s[1], s[1].size(-1)),
                                       new_rows_like(s[2], s[2].size(-1))};
                     const Tensor ins[6] = {s[0], s[1], s[2], s[3], readable(g[0].to(s[0].dtype())), s[4]};
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
