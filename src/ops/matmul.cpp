// matmul, mm and bmm: argument checks, 1-d promotion, batch broadcasting and dtype promotion
// here; the CPU kernel turns the (already broadcast) operands into pointer/stride GEMM
// problems (ops/matmul_plan.h) for kernels/cpu/gemm.h.
//
// Kernel contract: inputs (..., m, k) and (..., k, n) with identical batch dims (broadcast
// dims have stride 0), output (..., m, n), all of the op's dtype.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/matmul.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/gemm.h"
#include "ops/matmul_plan.h"

namespace strata {

namespace {

// How a (rows, cols) matrix with strides (sr, sc) can be read in place: row-major with
// leading dim sr, or stored transposed (column-major) with leading dim sc. Size-1 dims
// have no meaningful stride, so either orientation accepts them.
std::optional<detail::MatrixLayout> in_place_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= std::max<int64_t>(cols, 1)))
    return detail::MatrixLayout{rows <= 1 ? std::max<int64_t>(cols, 1) : sr, false};
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= std::max<int64_t>(rows, 1)))
    return detail::MatrixLayout{cols <= 1 ? std::max<int64_t>(rows, 1) : sc, true};
  return std::nullopt;
}

// A contiguous copy of t's distinct values that keeps its broadcast (stride-0) batch dims
// broadcast, so an irregular operand is never materialised once per batch.
Tensor compact_copy(const Tensor& t) {
  Shape s = t.shape();
  for (int64_t d = 0; d + 2 < t.dim(); ++d)
    if (t.strides()[d] == 0) s[d] = 1;
  return t.as_strided(s, t.strides(), t.storage_offset()).contiguous().expand(t.shape());
}

detail::MatrixLayout operand_layout(Tensor& t, int64_t rows, int64_t cols) {
  auto layout = in_place_layout(rows, cols, t.stride(-2), t.stride(-1));
  if (!layout) {
    t = compact_copy(t);
    layout = in_place_layout(rows, cols, t.stride(-2), t.stride(-1));
  }
  return *layout;
}

// Batch dims, innermost first, with size-1 dims dropped and dims merged where every operand
// steps through them evenly.
std::vector<detail::BatchDim> coalesce_batch(const Tensor& a, const Tensor& b, const Tensor& c) {
  std::vector<detail::BatchDim> dims;
  for (int64_t d = c.dim() - 3; d >= 0; --d) {
    detail::BatchDim x{c.shape()[d], a.strides()[d], b.strides()[d], c.strides()[d]};
    if (x.size == 1) continue;
    if (!dims.empty()) {
      detail::BatchDim& in = dims.back();
      if (x.a == in.a * in.size && x.b == in.b * in.size && x.c == in.c * in.size) {
        in.size *= x.size;
        continue;
      }
    }
    dims.push_back(x);
  }
  return dims;
}

void cpu_matmul(const KernelCall& call) {
  Tensor a = call.inputs[0], b = call.inputs[1];
  Tensor& out = call.outputs[0];
  STRATA_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.dim() == out.dim(),
               "[matmul] kernel needs broadcast operands, got shapes {}, {} -> {}", a.shape(), b.shape(), out.shape());
  if (out.numel() == 0) return;
  Tensor c = out.is_contiguous() ? out : detail::make_tensor(out.shape(), out.dtype(), out.device());
  const detail::GemmPlan plan = detail::plan_gemm(a, b, c);
  cpu::GemmProblem p;
  p.type = detail::cpu_gemm_type(c.dtype(), "matmul");
  p.batch = plan.batch;
  p.m = plan.m;
  p.n = plan.n;
  p.k = plan.k;
  p.a = cpu::GemmInput{nullptr, plan.a.ld, plan.stride_a, plan.a.trans};
  p.b = cpu::GemmInput{nullptr, plan.b.ld, plan.stride_b, plan.b.trans};
  p.c = cpu::GemmOutput{nullptr, plan.ldc, plan.stride_c};
  const int64_t item = c.itemsize();
  try {
    detail::for_each_gemm_call(plan, [&](int64_t oa, int64_t ob, int64_t oc) {
      cpu::GemmProblem q = p;
      if (plan.k > 0) {
        q.a.data = static_cast<const char*>(a.data()) + oa * item;
        q.b.data = static_cast<const char*>(b.data()) + ob * item;
      }
      q.c.data = static_cast<char*>(c.data()) + oc * item;
      cpu::gemm(q);
    });
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    detail::throw_error("{} (shapes {} and {})", e.what(), a.shape(), b.shape());
  }
  if (!c.is_same(out)) out.copy_(c);
}

Tensor matmul_forward(const Tensor& a, const Tensor& b, std::string_view op) {
  STRATA_CHECK(a.defined() && b.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(a.device() == b.device(), "[{}] inputs are on different devices: {} and {}", op, a.device(), b.device());
  STRATA_CHECK(a.dim() >= 1 && b.dim() >= 1, "[{}] both inputs need at least 1 dim, got shapes {} and {}", op,
               a.shape(), b.shape());
  const DType t = promote_types(a.dtype(), b.dtype());
  STRATA_CHECK(t != kBool, "[{}] not supported for bool tensors (shapes {} and {})", op, a.shape(), b.shape());
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  const Tensor a2 = a_vec ? a.unsqueeze(0) : a;  // (1, k)
  const Tensor b2 = b_vec ? b.unsqueeze(1) : b;  // (k, 1)
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  STRATA_CHECK(k == b2.size(-2), "[{}] shapes {} and {} cannot be multiplied ({} columns against {} rows)", op,
               a.shape(), b.shape(), k, b2.size(-2));

  // broadcast the batch dims, aligned from the right
  const int64_t na = a2.dim() - 2, nb = b2.dim() - 2, nd = std::max(na, nb);
  Shape batch(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) {
    int64_t da = i - (nd - na), db = i - (nd - nb);
    int64_t sa = da >= 0 ? a2.shape()[da] : 1, sb = db >= 0 ? b2.shape()[db] : 1;
    STRATA_CHECK(sa == sb || sa == 1 || sb == 1, "[{}] batch dims of shapes {} and {} do not broadcast", op,
                 a.shape(), b.shape());
    batch[i] = sa == 1 ? sb : sa;
  }
  auto with = [&](int64_t r, int64_t c) {
    Shape s = batch;
    s.push_back(r);
    s.push_back(c);
    return s;
  };
  const Tensor ins[2] = {a2.to(t).expand(with(m, k)), b2.to(t).expand(with(k, n))};
  Tensor out = detail::make_tensor(with(m, n), t, a.device());
  run_kernel(OpId::matmul, t, KernelCall{ins, {&out, 1}});

  Shape result = batch;
  if (!a_vec) result.push_back(m);
  if (!b_vec) result.push_back(n);
  return out.view(result);
}

// The gradients of a @ b, written with matmul itself; broadcast batch dims come back
// unsummed and the engine reduces them to each input's shape.
// Gradients for the operands that need them only (a product with data or a constant would
// otherwise pay a whole GEMM for nothing).
// Each operand is saved only for the other's gradient (an unsaved one is undefined here): its
// rank and whether it is a transposed view are all its own gradient needs of it.
struct OperandInfo {
  int64_t dim;
  bool transposed;  // rows unit-stride, as attention's k^T
};

OperandInfo operand_info(const Tensor& t) {
  return {t.dim(), t.dim() >= 2 && t.stride(-2) == 1 && t.stride(-1) != 1 && t.size(-2) > 1};
}

autograd::Grads matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, OperandInfo ai, OperandInfo bi,
                                bool need_a, bool need_b) {
  Tensor ga, gb;
  if (ai.dim == 1 && bi.dim == 1) {
    if (need_a) ga = g * b;
    if (need_b) gb = g * a;
  } else if (ai.dim == 1) {  // (k) @ (..., k, n) -> (..., n)
    Tensor g2 = g.unsqueeze(-1).transpose(-1, -2);  // (..., 1, n)
    if (need_a) ga = matmul(g2, b.transpose(-1, -2)).squeeze(-2);
    if (need_b) gb = matmul(a.unsqueeze(-1), g2);
  } else if (bi.dim == 1) {  // (..., m, k) @ (k) -> (..., m)
    Tensor g2 = g.unsqueeze(-1);  // (..., m, 1)
    if (need_a) ga = matmul(g2, b.unsqueeze(0));
    if (need_b) gb = matmul(a.transpose(-1, -2), g2).squeeze(-1);
  } else {
    // A gradient comes out in its input's layout: for an input that is a transposed view (its
    // rows unit-stride, as attention's k^T), the transposed product, transposed back as a
    // view, so that what consumes it later reads it in place rather than copying it.
    if (need_a)
      ga = ai.transposed ? matmul(b, g.transpose(-1, -2)).transpose(-1, -2) : matmul(g, b.transpose(-1, -2));
    if (need_b)
      gb = bi.transposed ? matmul(g.transpose(-1, -2), a).transpose(-1, -2) : matmul(a.transpose(-1, -2), g);
  }
  return {ga, gb};
}

Tensor matmul_impl(const Tensor& a, const Tensor& b, std::string_view op) {
  amp::detail::AutocastScope amp_scope(op, a, b);
  if (amp_scope.cast()) return matmul_impl(amp_scope[0], amp_scope[1], op);
  Tensor out;
  {
    NoGradGuard no_grad;  // the reshapes and casts inside are not part of the graph
    out = matmul_forward(a, b, op);
  }
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  autograd::record("matmul", {a, b}, {out}, {need_b ? a : Tensor(), need_a ? b : Tensor()},
                   [need_a, need_b, ai = operand_info(a), bi = operand_info(b)](const autograd::Grads& g,
                                                                                const autograd::Saved& s) {
                     return matmul_backward(g[0], s[0], s[1], ai, bi, need_a, need_b);
                   });
  return out;
}

}  // namespace

namespace detail {

GemmPlan plan_gemm(Tensor& a, Tensor& b, const Tensor& c) {
  GemmPlan p;
  p.m = c.size(-2);
  p.n = c.size(-1);
  p.k = a.size(-1);
  p.ldc = p.n;
  if (p.k > 0) {
    p.a = operand_layout(a, p.m, p.k);
    p.b = operand_layout(b, p.k, p.n);
  }
  std::vector<BatchDim> dims = coalesce_batch(a, b, c);
  if (!dims.empty()) {
    p.batch = dims.front().size;
    p.stride_a = dims.front().a;
    p.stride_b = dims.front().b;
    p.stride_c = dims.front().c;
    p.outer.assign(dims.begin() + 1, dims.end());
  }
  // (batch, m, k) x shared (k, n): one (batch * m, k) x (k, n) product
  if (p.batch > 1 && p.stride_b == 0 && !p.a.trans && p.stride_a == p.m * p.a.ld && p.stride_c == p.m * p.n) {
    p.m *= p.batch;
    p.batch = 1;
    p.stride_a = p.stride_c = 0;
  }
  return p;
}

void register_matmul_kernels(KernelTable& table) {
  table.set(OpId::matmul, DeviceType::CPU, kNumericDTypes, cpu_matmul);
}
}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_impl(a, b, "matmul"); }

Tensor mm(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.defined() && b.defined(), "[mm] input tensor is undefined");
  STRATA_CHECK(a.dim() == 2 && b.dim() == 2, "[mm] both inputs must be 2-d, got shapes {} and {}", a.shape(),
               b.shape());
  return matmul_impl(a, b, "mm");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.defined() && b.defined(), "[bmm] input tensor is undefined");
  STRATA_CHECK(a.dim() == 3 && b.dim() == 3, "[bmm] both inputs must be 3-d, got shapes {} and {}", a.shape(),
               b.shape());
  STRATA_CHECK(a.size(0) == b.size(0), "[bmm] batch sizes differ: shapes {} and {}", a.shape(), b.shape());
  return matmul_impl(a, b, "bmm");
}

Tensor Tensor::matmul(const Tensor& other) const { return strata::matmul(*this, other); }

}  // namespace strata
