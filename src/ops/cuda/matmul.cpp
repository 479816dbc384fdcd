// CUDA launchers of matmul and linear (src/ops/matmul.cpp, src/ops/linear.cpp). Operands are
// planned as on the CPU (ops/matmul_plan.h: transposed views read in place, broadcast batch
// dims as stride 0, irregular views compacted first) and each call of the plan goes to
// kernels/cuda/gemm.h on the current stream, with this thread's cuBLASLt/cuBLAS handles and
// their workspace on that stream (core/cuda/blas.h). linear's bias and GELU ride in the GEMM's
// epilogue. Plain C++: nvcc never sees strata's headers.
#include <string_view>

#include <strata/core/cuda.hpp>
#include <strata/ops/matmul.hpp>

#include "core/cuda/blas.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cuda/gemm.h"
#include "ops/cuda/launch.h"
#include "ops/matmul_plan.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

ck::GemmType gemm_type(DType t, std::string_view op) {
  switch (t) {
    case kFloat32: return ck::GemmType::F32;
    case kFloat64: return ck::GemmType::F64;
    case kFloat16: return ck::GemmType::F16;
    case kBFloat16: return ck::GemmType::BF16;
    default: break;
  }
  detail::throw_error("[{}] not supported on CUDA for dtype {}", op, t);
}

// The message of STRATA_CUBLAS_CHECK / STRATA_CUDA_CHECK for a call made inside the kernel.
void check_gemm(const ck::GemmStatus& s, std::string_view op) {
  if (s.ok()) return;
  if (s.cuda != cudaSuccess) detail::throw_error("[{}] {} failed: {}", op, s.call, cudaGetErrorString(s.cuda));
  detail::throw_error("[{}] {} failed: {}", op, s.call, cublasGetStatusString(s.blas));
}

// Runs every call of `plan` (c = a @ b, then the epilogue) on c's device and current stream.
void run_plan(const detail::GemmPlan& plan, const Tensor& a, const Tensor& b, Tensor& c, const Tensor& bias,
              ck::GemmEpilogue epilogue, std::string_view op) {
  const int device = c.device().index;
  cuda::DeviceGuard guard(device);
  const cuda::BlasHandles handles = cuda::blas_handles(device, op);
  ck::GemmContext ctx;
  ctx.device = device;
  ctx.lt = handles.lt;
  ctx.blas = handles.blas;
  ctx.stream = cuda_launch::stream_for(c);
  ctx.workspace = cuda::blas_workspace(device, ctx.stream, handles, op);
  ctx.workspace_bytes = cuda::kBlasWorkspaceBytes;

  ck::GemmProblem p;
  p.type = gemm_type(c.dtype(), op);
  p.batch = plan.batch;
  p.m = plan.m;
  p.n = plan.n;
  p.k = plan.k;
  p.a = ck::GemmInput{nullptr, plan.a.ld, plan.stride_a, plan.a.trans};
  p.b = ck::GemmInput{nullptr, plan.b.ld, plan.stride_b, plan.b.trans};
  p.c = ck::GemmOutput{nullptr, plan.ldc, plan.stride_c};
  p.epilogue = epilogue;
  p.bias = bias.defined() ? bias.data() : nullptr;
  p.allow_tf32 = cuda::allow_tf32();
  const int64_t item = c.itemsize();
  detail::for_each_gemm_call(plan, [&](int64_t oa, int64_t ob, int64_t oc) {
    ck::GemmProblem q = p;
    if (plan.k > 0) {
      q.a.data = static_cast<const char*>(a.data()) + oa * item;
      q.b.data = static_cast<const char*>(b.data()) + ob * item;
    }
    q.c.data = static_cast<char*>(c.data()) + oc * item;
    check_gemm(ck::gemm(q, ctx), op);
  });
}

// Whether t's batch dims (all but the last two) are of a kind the plan cannot fold into one
// strided batch, where a compact copy would fold: two or more of size > 1, none broadcast
// (stride 0), not nested (one dim's stride is not the next one's extent). Attention's heads,
// strided views of a (B, T, H, E) projection, are such a batch.
bool batch_splits_into_calls(const Tensor& t) {
  int64_t inner_extent = -1;  // stride * size of the next batch dim of size > 1
  int dims = 0;
  bool nested = true;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) == 0) return false;
    if (inner_extent >= 0 && t.stride(d) != inner_extent) nested = false;
    inner_extent = t.stride(d) * t.size(d);
    ++dims;
  }
  return dims >= 2 && !nested;
}

// inputs (..., m, k), (..., k, n) with the output's batch dims; output (..., m, n).
void cuda_matmul(const KernelCall& call) {
  Tensor a = call.inputs[0], b = call.inputs[1];
  Tensor& out = call.outputs[0];
  STRATA_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.dim() == out.dim(),
               "[matmul] kernel needs broadcast operands, got shapes {}, {} -> {}", a.shape(), b.shape(), out.shape());
  if (out.numel() == 0) return;
  // One batched call over a compact copy beats one call per outer index: the copy reads and
  // writes the operand once, and small per-call batches run cuBLAS's small tiles (seen 8x
  // slower for attention's 8-head calls).
  if (batch_splits_into_calls(a)) a = a.contiguous();
  if (batch_splits_into_calls(b)) b = b.contiguous();
  Tensor c = out.is_contiguous() ? out : detail::make_tensor(out.shape(), out.dtype(), out.device());
  const detail::GemmPlan plan = detail::plan_gemm(a, b, c);
  run_plan(plan, a, b, c, Tensor(), ck::GemmEpilogue::None, "matmul");
  if (!c.is_same(out)) out.copy_(c);
}

// inputs x (rows, in), weight (out, in), bias (out) contiguous or undefined; output a
// contiguous (rows, out).
void cuda_linear(const KernelCall& call) {
  Tensor x = call.inputs[0], wt = call.inputs[1].t();  // (rows, in), (in, out)
  const Tensor& bias = call.inputs[2];
  Tensor& y = call.outputs[0];
  const bool gelu = call.param<LinearParams>().gelu_tanh;
  STRATA_CHECK(y.is_contiguous() && (!bias.defined() || bias.is_contiguous()),
               "[linear] kernel needs a contiguous output and bias");
  if (y.numel() == 0) return;
  const detail::GemmPlan plan = detail::plan_gemm(x, wt, y);
  const ck::GemmEpilogue epilogue = bias.defined() ? (gelu ? ck::GemmEpilogue::GeluBias : ck::GemmEpilogue::Bias)
                                                   : (gelu ? ck::GemmEpilogue::Gelu : ck::GemmEpilogue::None);
  run_plan(plan, x, wt, y, bias, epilogue, gelu ? "linear_gelu" : "linear");
}

}  // namespace

namespace detail {
void register_cuda_matmul_kernels(KernelTable& table) {
  table.set(OpId::matmul, DeviceType::CUDA, kFloatDTypes, cuda_matmul);
  table.set(OpId::linear, DeviceType::CUDA, kFloatDTypes, cuda_linear);
}
}  // namespace detail

}  // namespace strata
