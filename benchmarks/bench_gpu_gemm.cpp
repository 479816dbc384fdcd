// bench_gpu's GEMM rows: strata::matmul beside the plainest direct cuBLASLt call for the same
// problem (the heuristic's first algorithm with a 32 MiB workspace, split-K sums in f32 as in
// strata), so the ratio shows what strata's planning, dispatch and allocation cost over the
// library underneath (target: 0.95 or better). Square 4096 and 8192 products in bf16, fp16
// and fp32 on TF32 tensor cores, and the two MLP products of a GPT-2-small layer at 8192
// tokens in bf16. TFLOP/s count 2*m*n*k. The two sides are timed in alternation.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <strata/strata.hpp>

#include "bench_gpu.h"

namespace bench_gpu {

namespace st = strata;

namespace {

#define BENCH_LT_CHECK(call)                                                                                        \
  do {                                                                                                              \
    const cublasStatus_t status_ = (call);                                                                          \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                                           \
      throw std::runtime_error(fmt::format("[cublasLt baseline] {}: {}", #call, cublasLtGetStatusString(status_))); \
  } while (0)

// The cuBLASLt objects of one plan, released in reverse order whatever step failed.
struct LtObjects {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtObjects() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
  }
};

// C (m, n) = A (m, k) * B (k, n), all row-major and dense, of one data type, f32 accumulation.
// cuBLASLt is column-major, so it computes C^T = B^T * A^T: the row-major B is a column-major
// (n, k) matrix with leading dimension n, A a (k, m) one with leading dimension k.
class LtGemm {
 public:
  LtGemm(cudaDataType_t type, cublasComputeType_t compute, int64_t m, int64_t n, int64_t k, size_t workspace_bytes)
      : workspace_bytes_(workspace_bytes) {
    BENCH_LT_CHECK(cublasLtCreate(&o_.handle));
    BENCH_LT_CHECK(cublasLtMatmulDescCreate(&o_.desc, compute, CUDA_R_32F));
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&o_.a, type, n, k, n));  // B^T
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&o_.b, type, k, m, k));  // A^T
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&o_.c, type, n, m, n));  // C^T
    BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&o_.pref));
    const uint64_t bytes = workspace_bytes;
    BENCH_LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(o_.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
    if (type == CUDA_R_16F || type == CUDA_R_16BF) {
      // strata's own restriction (kernels/cuda/gemm.cpp): split-K partial sums reduced in f32,
      // so the heuristic chooses among the same algorithms on both sides
      const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      BENCH_LT_CHECK(
          cublasLtMatmulPreferenceSetAttribute(o_.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    BENCH_LT_CHECK(
        cublasLtMatmulAlgoGetHeuristic(o_.handle, o_.desc, o_.a, o_.b, o_.c, o_.c, o_.pref, 1, &result, &found));
    if (found == 0) throw std::runtime_error("[cublasLt baseline] the heuristic found no algorithm");
    algo_ = result.algo;
  }

  void run(const void* a, const void* b, void* c, void* workspace, cudaStream_t stream) const {
    const float alpha = 1, beta = 0;
    BENCH_LT_CHECK(cublasLtMatmul(o_.handle, o_.desc, &alpha, b, o_.a, a, o_.b, &beta, c, o_.c, c, o_.c, &algo_,
                                  workspace, workspace_bytes_, stream));
  }

 private:
  LtObjects o_;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspace_bytes_;
};

struct Shape {
  int64_t m, n, k;
};

struct GemmCase {
  std::string key, what;
  st::DType dtype;
  bool tf32;
  Shape shape;
};

cudaDataType_t cuda_type(st::DType t) {
  if (t == st::kBFloat16) return CUDA_R_16BF;
  if (t == st::kFloat16) return CUDA_R_16F;
  return CUDA_R_32F;
}

// Sets strata's TF32 switch for the lifetime of the guard.
class Tf32Guard {
 public:
  explicit Tf32Guard(bool on) : previous_(st::cuda::allow_tf32()) { st::cuda::set_allow_tf32(on); }
  ~Tf32Guard() { st::cuda::set_allow_tf32(previous_); }

 private:
  bool previous_;
};

// The medians of `a` and `b`, timed in alternation (a, b, a, b, ...) after their warm-ups: the
// GPU's clock falls as a long run of large products heats it, and taking one side's run after
// the other's would hand the second a slower GPU (seen as 10% on 8192^3 products).
std::pair<double, double> alternating_median_ms(const Settings& settings, const std::function<void()>& a,
                                                const std::function<void()>& b) {
  for (int i = 0; i < settings.warmup; ++i) {
    a();
    b();
  }
  const int reps = settings.reps;
  std::vector<st::cuda::Event> events;
  for (int i = 0; i <= 2 * reps; ++i) events.emplace_back(/*enable_timing=*/true);
  events[0].record();
  for (int i = 0; i < reps; ++i) {
    a();
    events[2 * i + 1].record();
    b();
    events[2 * i + 2].record();
  }
  events.back().synchronize();
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(events[2 * i].elapsed_time(events[2 * i + 1]));
    tb.push_back(events[2 * i + 1].elapsed_time(events[2 * i + 2]));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  return {median(ta), median(tb)};
}

void gemm_row(Context& ctx, const GemmCase& g) {
  double raw = NAN;
  std::string raw_error;
  add_row(ctx, Row{.key = g.key, .what = g.what, .unit = "TFLOP/s"}, [&] {
    const auto [m, n, k] = g.shape;
    const auto opts = st::TensorOptions(g.dtype, st::Device::cuda());
    st::Tensor a = st::randn({m, k}, opts), b = st::randn({k, n}, opts), c = st::empty({m, n}, opts);
    const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    auto tflops = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
    Tf32Guard tf32(g.tf32);
    st::Tensor out;
    const std::function<void()> ours = [&] { out = st::matmul(a, b); };
    try {  // the baseline failing leaves strata's figure standing
      const size_t workspace_bytes = 32u << 20;
      st::Tensor workspace =
          st::empty({static_cast<int64_t>(workspace_bytes)}, st::TensorOptions(st::kUInt8, st::Device::cuda()));
      const LtGemm lt(cuda_type(g.dtype), g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, m, n, k,
                      workspace_bytes);
      const auto stream = static_cast<cudaStream_t>(st::cuda::Stream::current().handle());
      const auto [raw_ms, ours_ms] = alternating_median_ms(
          ctx.settings, [&] { lt.run(a.data(), b.data(), c.data(), workspace.data(), stream); }, ours);
      raw = tflops(raw_ms);
      return tflops(ours_ms);
    } catch (const std::exception& e) {
      raw_error = e.what();
    }
    return tflops(median_ms(ctx.settings, ours));
  });
  Row& row = ctx.rows.back();
  if (!row.note.empty()) return;
  row.note = raw_error.empty() ? fmt::format("cuBLASLt {:.1f}, ratio {:.3f}", raw, row.value / raw)
                               : "cuBLASLt baseline failed: " + raw_error;
}

}  // namespace

void run_gemm_rows(Context& ctx) {
  if (!wants(ctx.settings, "gemm")) return;
  std::vector<GemmCase> cases;
  for (const auto& [name, dtype, tf32] :
       {std::tuple{"bf16", st::kBFloat16, false}, std::tuple{"f16", st::kFloat16, false},
        std::tuple{"tf32", st::kFloat32, true}})
    for (int64_t s : {4096, 8192})
      cases.push_back(
          {fmt::format("gemm_{}_{}", name, s), fmt::format("matmul {} {}^3", name, s), dtype, tf32, {s, s, s}});
  cases.push_back({"gemm_bf16_mlp_up", "matmul bf16 8192x768 * 768x3072", st::kBFloat16, false, {8192, 3072, 768}});
  cases.push_back({"gemm_bf16_mlp_down", "matmul bf16 8192x3072 * 3072x768", st::kBFloat16, false, {8192, 768, 3072}});
  for (const GemmCase& g : cases) gemm_row(ctx, g);
  st::cuda::empty_cache();
}

}  // namespace bench_gpu
