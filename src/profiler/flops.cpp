// FLOP formulas per op, on the shapes the kernels receive (see each op's run_kernel call):
//   matmul   a (*, m, k), b (*, k, n) broadcast to one batch: 2 * batch * m * n * k (mm, bmm too)
//   linear   x (rows, in), weight (out, in): 2 * rows * in * out (the bias add is not counted)
//   conv2d   x, weight (O, C/groups, kh, kw) -> y (N, O, Ho, Wo): 2 * numel(y) * C/groups * kh * kw;
//            its input gradient (gy, weight) costs the same, as does its weight gradient (gy, x);
//            conv3d the same with a depth dim (kd, Do)
//   attention q (*, L, E), k (*, S, E), v (*, S, Ev): 2 * batch * L * S * (E + Ev); the backward
//            (q, k, v, o, gy, lse) twice that, as torch counts it (the recomputed scores excluded).
// Causal masks are not discounted, as in torch.
#include "profiler/flops.h"

#include <strata/core/tensor.hpp>

namespace strata::profiler::detail {

namespace {

double numel(const Tensor& t) { return t.defined() ? static_cast<double>(t.numel()) : 0; }
double size(const Tensor& t, int64_t d) { return static_cast<double>(t.size(d)); }

// batch * L * S * (E + Ev) for attention's q, k, v
double attention_products(const Tensor& q, const Tensor& k, const Tensor& v) {
  const double batch_l = numel(q) / size(q, -1);  // (*, L)
  return batch_l * size(k, -2) * (size(q, -1) + size(v, -1));
}

bool all_defined(const KernelCall& call, size_t inputs, size_t outputs) {
  if (call.inputs.size() < inputs || call.outputs.size() < outputs) return false;
  for (size_t i = 0; i < inputs; ++i)
    if (!call.inputs[i].defined() || call.inputs[i].dim() < 1) return false;
  for (size_t i = 0; i < outputs; ++i)
    if (!call.outputs[i].defined()) return false;
  return true;
}

}  // namespace

double kernel_flops(OpId op, const KernelCall& call) {
  const auto& in = call.inputs;
  switch (op) {
    case OpId::matmul:  // (*, m, k) @ (*, k, n) -> (*, m, n)
      if (!all_defined(call, 2, 1) || in[0].dim() < 2) return 0;
      return 2 * numel(call.outputs[0]) * size(in[0], -1);
    case OpId::linear:  // (rows, in) @ (out, in)^T -> (rows, out)
      if (!all_defined(call, 2, 1)) return 0;
      return 2 * numel(call.outputs[0]) * size(in[0], -1);
    case OpId::conv2d:  // y (N, O, Ho, Wo) from weight (O, C/g, kh, kw)
    case OpId::conv3d:
    case OpId::conv2d_backward_input:  // gx from gy (N, O, Ho, Wo) and weight
    case OpId::conv3d_backward_input:
      if (!all_defined(call, 2, 1) || in[1].dim() < 4) return 0;
      return 2 * numel(op == OpId::conv2d || op == OpId::conv3d ? call.outputs[0] : in[0]) * numel(in[1]) /
             size(in[1], 0);
    case OpId::conv2d_backward_weight:  // gw (O, C/g, kh, kw) from gy (N, O, Ho, Wo) and x
    case OpId::conv3d_backward_weight:
      if (!all_defined(call, 2, 1) || call.outputs[0].dim() < 4) return 0;
      return 2 * numel(in[0]) * numel(call.outputs[0]) / size(call.outputs[0], 0);
    case OpId::attention:
      if (!all_defined(call, 3, 1)) return 0;
      return 2 * attention_products(in[0], in[1], in[2]);
    case OpId::attention_backward:
      if (!all_defined(call, 3, 1)) return 0;
      return 4 * attention_products(in[0], in[1], in[2]);
    default:
      return 0;
  }
}

}  // namespace strata::profiler::detail
