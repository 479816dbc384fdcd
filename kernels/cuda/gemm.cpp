// gemm() of kernels/cuda/gemm.h: cuBLASLt with plans cached per problem signature on each
// thread, legacy cuBLAS (64-bit interface) for what cuBLASLt cannot run, and the epilogue
// kernel for an epilogue that was not fused. Host code only: it calls the libraries.
//
// Note [Row-major products in column-major BLAS]
// cuBLAS is column-major. A row-major (r, c) matrix with leading dim ld, read column-major,
// is its transpose (c, r) with the same ld. So C = A B (row-major) is computed as
// C^T = B^T A^T: the library's first operand is our B, its second our A, its m our n and its
// n our m. An operand stored transposed (trans) reads column-major as itself, so it gets
// op = T. cuBLASLt's bias epilogue adds one value per row of its D, which is one per column
// of our C: one per output feature, as linear needs.
#include <cstring>
#include <unordered_map>

#include <cublas_v2.h>

#include "gemm.h"

namespace strata::cuda_kernels {

namespace {

// cuBLASLt takes sizes as 64-bit values but runs only 32-bit ones; larger problems go to
// cuBLAS's 64-bit interface.
constexpr int64_t kMaxLtSize = 0x7fffffff;
// Plans a thread keeps; past this the cache starts over (a training loop needs a handful).
constexpr size_t kMaxCachedPlans = 1024;

// Returns the failing call and its status from the enclosing function.
#define GEMM_TRY(call)                                                       \
  do {                                                                       \
    cublasStatus_t status_ = (call);                                         \
    if (status_ != CUBLAS_STATUS_SUCCESS) return GemmStatus{#call, status_}; \
  } while (0)

cudaDataType data_type(GemmType t) {
  switch (t) {
    case GemmType::F64: return CUDA_R_64F;
    case GemmType::F16: return CUDA_R_16F;
    case GemmType::BF16: return CUDA_R_16BF;
    case GemmType::F32: break;
  }
  return CUDA_R_32F;
}

int64_t type_size(GemmType t) { return t == GemmType::F64 ? 8 : t == GemmType::F32 ? 4 : 2; }

// f16/bf16 accumulate in f32; f32 on TF32 tensor cores only when allowed.
cublasComputeType_t compute_type(GemmType t, bool tf32) {
  if (t == GemmType::F64) return CUBLAS_COMPUTE_64F;
  if (t == GemmType::F32 && tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

bool has_bias(GemmEpilogue e) { return e == GemmEpilogue::Bias || e == GemmEpilogue::GeluBias; }
bool has_gelu(GemmEpilogue e) { return e == GemmEpilogue::Gelu || e == GemmEpilogue::GeluBias; }

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::None: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// alpha = 1 and beta = 0 in the scale type (double for f64, float otherwise).
struct Scalars {
  float f[2] = {1.0f, 0.0f};
  double d[2] = {1.0, 0.0};
  const void* alpha(GemmType t) const { return t == GemmType::F64 ? static_cast<const void*>(&d[0]) : &f[0]; }
  const void* beta(GemmType t) const { return t == GemmType::F64 ? static_cast<const void*>(&d[1]) : &f[1]; }
};

// What cuBLASLt's bias epilogue reads its bias with (16-byte vectors), whatever the preferences.
constexpr uint32_t kMinBiasAlignment = 16;

// The largest power of two, up to 256 bytes, dividing the address of every matrix of the batch.
uint32_t alignment(const void* p, int64_t batch, int64_t batch_stride, GemmType t) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride * type_size(t));
  uint32_t a = 256;
  while (a > 1 && bits % a != 0) a /= 2;
  return a;
}

// Everything the descriptors and the heuristic's choice depend on.
struct PlanKey {
  int device = 0;
  GemmType type = GemmType::F32;
  GemmEpilogue epilogue = GemmEpilogue::None;
  bool tf32 = false, trans_a = false, trans_b = false;
  int64_t batch = 0, m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0;
  uint64_t workspace = 0;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    mix(static_cast<uint64_t>(k.device) << 32 | static_cast<uint64_t>(k.type) << 24 |
        static_cast<uint64_t>(k.epilogue) << 16 | uint64_t(k.tf32) << 2 | uint64_t(k.trans_a) << 1 | k.trans_b);
    for (int64_t v : {k.batch, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.stride_a, k.stride_b, k.stride_c})
      mix(static_cast<uint64_t>(v));
    mix(uint64_t(k.align_a) << 48 | uint64_t(k.align_b) << 32 | uint64_t(k.align_c) << 16 | k.align_bias);
    mix(k.workspace);
    return static_cast<size_t>(h);
  }
};

// Descriptors initialised in place (no create/destroy pairs) and the chosen algorithm.
// cuBLASLt's A is our B and its B our A (Note [Row-major products in column-major BLAS]).
struct LtPlan {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t lt_a, lt_b, lt_c;
  cublasLtMatmulAlgo_t algo;
  bool found = false;  // false: cuBLASLt has no algorithm for this problem
};

thread_local std::unordered_map<PlanKey, LtPlan, PlanKeyHash> t_plans;

PlanKey make_key(const GemmProblem& p, const GemmContext& ctx) {
  PlanKey k;
  k.device = ctx.device;
  k.type = p.type;
  k.epilogue = p.epilogue;
  k.tf32 = p.type == GemmType::F32 && p.allow_tf32;
  k.trans_a = p.a.trans;
  k.trans_b = p.b.trans;
  k.batch = p.batch, k.m = p.m, k.n = p.n, k.k = p.k;
  k.lda = p.a.ld, k.ldb = p.b.ld, k.ldc = p.c.ld;
  if (p.batch > 1) k.stride_a = p.a.batch_stride, k.stride_b = p.b.batch_stride, k.stride_c = p.c.batch_stride;
  k.align_a = alignment(p.a.data, p.batch, p.a.batch_stride, p.type);
  k.align_b = alignment(p.b.data, p.batch, p.b.batch_stride, p.type);
  k.align_c = alignment(p.c.data, p.batch, p.c.batch_stride, p.type);
  k.align_bias = has_bias(p.epilogue) ? alignment(p.bias, 1, 0, p.type) : 0;
  k.workspace = ctx.workspace_bytes;
  return k;
}

cublasStatus_t init_layout(cublasLtMatrixLayoutOpaque_t& layout, cudaDataType t, int64_t rows, int64_t cols,
                           int64_t ld, int64_t batch, int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutInit(&layout, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld);
  if (s != CUBLAS_STATUS_SUCCESS || batch <= 1) return s;
  const int32_t count = static_cast<int32_t>(batch);
  s = cublasLtMatrixLayoutSetAttribute(&layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutSetAttribute(&layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
}

template <class V>
cublasStatus_t set_desc(cublasLtMatmulDescOpaque_t& desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(&desc, attr, &value, sizeof(value));
}

template <class V>
cublasStatus_t set_pref(cublasLtMatmulPreferenceOpaque_t& pref, cublasLtMatmulPreferenceAttributes_t attr,
                        const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(&pref, attr, &value, sizeof(value));
}

// Fills the plan's descriptors for p and asks the heuristic for its best algorithm.
GemmStatus build_plan(const GemmProblem& p, const PlanKey& key, const GemmContext& ctx, LtPlan& plan) {
  const cudaDataType t = data_type(p.type);
  GEMM_TRY(cublasLtMatmulDescInit(&plan.desc, compute_type(p.type, key.tf32), p.type == GemmType::F64 ? CUDA_R_64F : CUDA_R_32F));
  const cublasOperation_t op_a = p.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
  GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
  if (p.epilogue != GemmEpilogue::None) {
    GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p.epilogue)));
    if (has_bias(p.epilogue)) {
      GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));
      GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(t)));
    }
  }
  // stored shapes, column-major: our B is (n, k) or, stored transposed, (k, n); our A likewise
  GEMM_TRY(init_layout(plan.lt_a, t, p.b.trans ? p.k : p.n, p.b.trans ? p.n : p.k, p.b.ld, p.batch, key.stride_b));
  GEMM_TRY(init_layout(plan.lt_b, t, p.a.trans ? p.m : p.k, p.a.trans ? p.k : p.m, p.a.ld, p.batch, key.stride_a));
  GEMM_TRY(init_layout(plan.lt_c, t, p.n, p.m, p.c.ld, p.batch, key.stride_c));

  cublasLtMatmulPreferenceOpaque_t pref;
  GEMM_TRY(cublasLtMatmulPreferenceInit(&pref));
  GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(ctx.workspace_bytes)));
  GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b));
  GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a));
  GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c));
  GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c));
  if (p.type == GemmType::F16 || p.type == GemmType::BF16) {
    // split-K partial sums reduced in f32, never rounded to the 16-bit output type on the way
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    GEMM_TRY(set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, mask));
  }
  cublasLtMatmulHeuristicResult_t result;
  std::memset(&result, 0, sizeof(result));
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx.lt, &plan.desc, &plan.lt_a, &plan.lt_b, &plan.lt_c,
                                                          &plan.lt_c, &pref, 1, &result, &count);
  // no algorithm for this problem, or descriptors cuBLASLt refuses (INVALID_VALUE) that cuBLAS
  // may still run: plan.found stays false and the caller falls back
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) return {};
  if (s != CUBLAS_STATUS_SUCCESS) return GemmStatus{"cublasLtMatmulAlgoGetHeuristic", s};
  plan.found = count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  plan.algo = result.algo;
  return {};
}

// Runs p through cuBLASLt; `found` is false (and nothing ran) when it has no algorithm.
GemmStatus run_lt(const GemmProblem& p, const GemmContext& ctx, bool& found) {
  const PlanKey key = make_key(p, ctx);
  if (t_plans.size() >= kMaxCachedPlans) t_plans.clear();
  auto [it, inserted] = t_plans.try_emplace(key);
  LtPlan& plan = it->second;
  if (inserted) {
    GemmStatus s = build_plan(p, key, ctx, plan);
    if (!s.ok()) {
      t_plans.erase(it);
      return s;
    }
  }
  found = plan.found;
  if (!found) return {};
  if (has_bias(p.epilogue)) GEMM_TRY(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));
  const Scalars one_zero;
  GEMM_TRY(cublasLtMatmul(ctx.lt, &plan.desc, one_zero.alpha(p.type), p.b.data, &plan.lt_a, p.a.data, &plan.lt_b,
                          one_zero.beta(p.type), p.c.data, &plan.lt_c, p.c.data, &plan.lt_c, &plan.algo,
                          ctx.workspace, ctx.workspace_bytes, ctx.stream));
  return {};
}

// Runs p (without its epilogue) through cuBLAS's 64-bit strided-batched GEMM.
GemmStatus run_cublas(const GemmProblem& p, const GemmContext& ctx) {
  // binding the stream resets the workspace, so both are set before every call
  GEMM_TRY(cublasSetStream(ctx.blas, ctx.stream));
  GEMM_TRY(cublasSetWorkspace(ctx.blas, ctx.workspace, ctx.workspace_bytes));
  GEMM_TRY(cublasSetMathMode(ctx.blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  const cudaDataType t = data_type(p.type);
  const Scalars one_zero;
  GEMM_TRY(cublasGemmStridedBatchedEx_64(
      ctx.blas, p.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, p.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, p.n, p.m, p.k,
      one_zero.alpha(p.type), p.b.data, t, p.b.ld, p.b.batch_stride, p.a.data, t, p.a.ld, p.a.batch_stride,
      one_zero.beta(p.type), p.c.data, t, p.c.ld, p.c.batch_stride, p.batch,
      compute_type(p.type, p.allow_tf32), CUBLAS_GEMM_DEFAULT));
  return {};
}

// c = epilogue(c), or epilogue(0) when `zero`, by the epilogue kernel.
GemmStatus run_epilogue(const GemmProblem& p, const GemmContext& ctx, bool zero) {
  const cudaError_t err = gemm_epilogue(p.type, p.batch, p.m, p.n, p.c.data, p.c.ld, p.c.batch_stride,
                                        has_bias(p.epilogue) ? p.bias : nullptr, has_gelu(p.epilogue), zero,
                                        ctx.stream);
  if (err != cudaSuccess) return GemmStatus{"gemm epilogue kernel launch", CUBLAS_STATUS_SUCCESS, err};
  return {};
}

}  // namespace

// Note [Exact GELU for float32]
// cuBLASLt's GELU epilogue evaluates tanh approximately (about 2^-11 relative error, seen as
// 5e-6 on values near 0.1): below the rounding of a 16-bit result or of TF32 products, but
// hundreds of ulps of a float32 one. A float32 product without TF32 (and a float64 one) fuses
// only the bias and applies GELU with the epilogue kernel, in full precision.
bool needs_exact_gelu(const GemmProblem& p) {
  return has_gelu(p.epilogue) && (p.type == GemmType::F64 || (p.type == GemmType::F32 && !p.allow_tf32));
}

GemmStatus gemm(const GemmProblem& p, const GemmContext& ctx) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return {};
  if (p.k <= 0) return run_epilogue(p, ctx, true);  // an empty sum: C = epilogue(0)
  if (needs_exact_gelu(p)) {
    GemmProblem product = p;
    product.epilogue = has_bias(p.epilogue) ? GemmEpilogue::Bias : GemmEpilogue::None;
    if (!has_bias(p.epilogue)) product.bias = nullptr;
    const GemmStatus s = gemm(product, ctx);
    if (!s.ok()) return s;
    GemmProblem gelu = p;
    gelu.epilogue = GemmEpilogue::Gelu;
    gelu.bias = nullptr;
    return run_epilogue(gelu, ctx, false);
  }
  const bool lt_sized = p.batch <= kMaxLtSize && p.m <= kMaxLtSize && p.n <= kMaxLtSize && p.k <= kMaxLtSize;
  if (lt_sized) {
    // a bias that is a view at an odd offset gets the plain product and the epilogue kernel
    const bool fusable = !has_bias(p.epilogue) || alignment(p.bias, 1, 0, p.type) >= kMinBiasAlignment;
    bool found = false;
    GemmStatus s;
    if (fusable) {
      s = run_lt(p, ctx, found);
      if (!s.ok() || found) return s;
    }
    if (p.epilogue != GemmEpilogue::None) {  // no fused epilogue here: the plain product, then the kernel
      GemmProblem plain = p;
      plain.epilogue = GemmEpilogue::None;
      plain.bias = nullptr;
      s = run_lt(plain, ctx, found);
      if (!s.ok()) return s;
      if (found) return run_epilogue(p, ctx, false);
    }
  }
  GemmStatus s = run_cublas(p, ctx);
  if (!s.ok() || p.epilogue == GemmEpilogue::None) return s;
  return run_epilogue(p, ctx, false);
}

int64_t gemm_plan_cache_size() { return static_cast<int64_t>(t_plans.size()); }

}  // namespace strata::cuda_kernels
