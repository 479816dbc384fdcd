// The op benchmark table: strata beside LibTorch (when built with it) on GEMM, elementwise
// and reduction workloads, layers forward + backward (linear, conv2d, layer norm, attention)
// and optimizer steps, in one process, with repetitions interleaved (run with
// --benchmark_enable_random_interleaving=true, as scripts/bench.sh does) so both libraries
// see the same machine noise. Ends with a summary of medians: GEMM in GFLOP/s against the
// measured FMA peak, memory-bound ops in GB/s against the measured memcpy bandwidth. The
// runners are in ops_strata.cpp and peer_torch.cpp.
//
//   STRATA_BENCH_THREADS   threads for both libraries (default 2)
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <strata/strata.hpp>

#include "machine.h"
#include "workload.h"

namespace {

using bench::Op;
using bench::Runner;
using bench::Workload;

enum class Unit { GFlops, GBytes };

struct Case {
  std::string id;     // benchmark name (no spaces, for --benchmark_filter)
  std::string label;  // what the summary table shows
  Workload w;
  Unit unit;
  double work;  // FLOP or bytes moved per iteration
};

constexpr int64_t kElems = int64_t(1) << 24;  // 16M floats, 64 MiB per tensor
constexpr int64_t kRows = 4096;

Case gemm(Op op, int64_t b, int64_t m, int64_t n, int64_t k, std::string id, std::string label) {
  return {std::move(id), std::move(label), {op, b, m, n, k}, Unit::GFlops, 2.0 * b * m * n * k};
}

Case memory(Op op, std::string id, std::string label, double tensors) {
  return {std::move(id), std::move(label), {op, 1, 0, kElems, 0}, Unit::GBytes, tensors * 4.0 * kElems};
}

Case reduction(Op op, std::string id, std::string label) {
  return {std::move(id), std::move(label), {op, 1, kRows, kRows, 0}, Unit::GBytes, 4.0 * kRows * kRows};
}

// Forward + backward FLOPs: 3 x the forward's (2 per multiply-add), as backward does two
// forward-sized products, the input's gradient and the weight's.
Case linear_train(int64_t m, int64_t k, int64_t n) {
  return {fmt::format("linear_train_{}x{}_{}", m, k, n), fmt::format("linear fwd+bwd ({}x{}) -> {}", m, k, n),
          {Op::LinearTrain, 1, m, n, k}, Unit::GFlops, 3 * 2.0 * m * n * k};
}

Case conv_train(int64_t batch, bench::ConvShape c) {
  std::string kernel = fmt::format("{0}x{0}{1}", c.kernel, c.stride > 1 ? fmt::format("s{}", c.stride) : "");
  double flops = 2.0 * batch * c.c_out * c.out_h() * c.out_w() * c.c_in * c.kernel * c.kernel;
  Workload w{Op::Conv2dTrain, batch};
  w.conv = c;
  return {fmt::format("conv_train_{}_{}to{}_{}_b{}", kernel, c.c_in, c.c_out, c.h, batch),
          fmt::format("conv fwd+bwd {} {}->{} {}x{} b{}", kernel, c.c_in, c.c_out, c.h, c.w, batch), w, Unit::GFlops,
          3 * flops};
}

// native: strata's 3-d kernels (its default); else composed of conv2d (set_native_conv3d off)
Case conv3d_train(int64_t batch, bench::ConvShape c, bool native) {
  double flops = 2.0 * batch * c.c_out * c.out_d() * c.out_h() * c.out_w() * c.c_in * c.kernel * c.kernel * c.kernel;
  Workload w{native ? Op::Conv3dTrain : Op::Conv3dComposedTrain, batch};
  w.conv = c;
  return {fmt::format("conv3d_train_{0}x{0}x{0}_{1}to{2}_{3}x{4}_b{5}{6}", c.kernel, c.c_in, c.c_out, c.d, c.h, batch,
                      native ? "" : "_composed"),
          fmt::format("conv3d fwd+bwd {0}x{0}x{0} {1}->{2} {3}x{4}x{5} b{6}{7}", c.kernel, c.c_in, c.c_out, c.d, c.h,
                      c.w, batch, native ? "" : " composed"),
          w, Unit::GFlops, 3 * flops};
}

// x read, y written, dy read, dx written (max pooling's int64 indices not counted), fp32
Case pool3d_train(int64_t batch, bench::ConvShape c, bool is_max) {
  const double bytes = 4.0 * batch * c.c_in * 2 * (c.d * c.h * c.w + c.out_d() * c.out_h() * c.out_w());
  Workload w{is_max ? Op::MaxPool3dTrain : Op::AvgPool3dTrain, batch};
  w.conv = c;
  const char* name = is_max ? "max" : "avg";
  return {fmt::format("{0}_pool3d_train_{1}x{1}x{1}s{2}_{3}c_{4}x{5}_b{6}", name, c.kernel, c.stride, c.c_in, c.d, c.h,
                      batch),
          fmt::format("{0}_pool3d fwd+bwd {1}^3 s{2} p{3} {4}c {5}x{6}x{7} b{8}", name, c.kernel, c.stride, c.pad,
                      c.c_in, c.d, c.h, c.w, batch),
          w, Unit::GBytes, bytes};
}

// Optimizer steps move bytes_per_param over every parameter: AdamW reads p, g, m, v and
// writes p, m, v (28); SGD with momentum reads p, g, buf and writes p, buf (20).
Case optimizer_step(Op op, int64_t params, const char* name, double bytes_per_param) {
  const std::string millions = fmt::format("{}M", params / 1000000);
  return {fmt::format("{}_step_{}", name, millions), fmt::format("{} step {} params (10 tensors)", name, millions),
          {op, 1, 10, params, 0}, Unit::GBytes, bytes_per_param * params};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> c;
    for (int64_t s : {256, 512, 1024, 2048, 4096})
      c.push_back(gemm(Op::Matmul, 1, s, s, s, fmt::format("gemm_{}", s), fmt::format("gemm {0}x{0}x{0}", s)));
    // the three GEMMs of a BERT-base / GPT-2 layer at 2048 tokens, and their transposed forms
    c.push_back(gemm(Op::Matmul, 1, 2048, 3072, 768, "gemm_2048x768_768x3072", "gemm (2048x768)(768x3072)"));
    c.push_back(gemm(Op::Matmul, 1, 2048, 768, 3072, "gemm_2048x3072_3072x768", "gemm (2048x3072)(3072x768)"));
    c.push_back(gemm(Op::Matmul, 1, 2048, 768, 768, "gemm_2048x768_768x768", "gemm (2048x768)(768x768)"));
    c.push_back(gemm(Op::MatmulNT, 1, 2048, 3072, 768, "linear_2048x768_3072x768T", "linear (2048x768)(3072x768)^T"));
    c.push_back(gemm(Op::BatchedNT, 24, 512, 512, 64, "attn_24x512x64_T", "attn (24x512x64)(24x512x64)^T"));
    c.push_back(memory(Op::Add, "add_16M", "add 16M (out = a + b)", 3));
    c.push_back(memory(Op::Mul, "mul_16M", "mul 16M (out = a * b)", 3));
    c.push_back(memory(Op::AddInPlace, "add_inplace_16M", "add_ 16M (a += b)", 3));
    c.push_back(memory(Op::Exp, "exp_16M", "exp 16M", 2));
    c.push_back(memory(Op::Gelu, "gelu_16M", "gelu 16M", 2));
    c.push_back(memory(Op::GeluTanh, "gelu_tanh_16M", "gelu (tanh) 16M", 2));
    c.push_back(memory(Op::Log, "log_16M", "log 16M", 2));
    c.push_back(memory(Op::Sin, "sin_16M", "sin 16M (of -100 to 100)", 2));
    c.push_back(memory(Op::Randn, "randn_16M", "randn 16M", 1));
    c.push_back({"randint_4M", "randint(0, 50000), 4M int64 (8 bytes written)", {Op::Randint, 1, 0, 4096000, 50000},
                 Unit::GBytes, 8.0 * 4096000});
    c.push_back(memory(Op::Dropout, "dropout_16M", "dropout 16M (x read; y, mask written)", 3));
    c.push_back({"transpose_4096x4096", "transpose 4096x4096 (.t().contiguous())", {Op::Transpose, 1, kRows, kRows, 0},
                 Unit::GBytes, 2 * 4.0 * kRows * kRows});
    // index_add_ counts src read and its rows of the table read and written; gather the output
    // written, the values read and the int64 index read
    c.push_back({"index_add_8192x512", "index_add_ 8192 rows of 512 into (50000, 512)",
                 {Op::IndexAdd, 1, 8192, 512, 50000}, Unit::GBytes, 3 * 4.0 * 8192 * 512 + 8.0 * 8192});
    c.push_back({"gather_4096x1024_by_64", "gather dim 1 of (4096, 1024) by (4096, 64)",
                 {Op::Gather, 1, 4096, 64, 1024}, Unit::GBytes, (4 + 4 + 8) * 4096.0 * 64});
    c.push_back({"sort_1M", "sort 1M (values and int64 indices)", {Op::Sort, 1, 0, 1 << 20, 0}, Unit::GBytes,
                 (4 + 4 + 8) * double(1 << 20)});
    c.push_back({"topk_10_of_4096x1000", "topk k=10 along rows of (4096, 1000)", {Op::Topk, 1, 4096, 1000, 10},
                 Unit::GBytes, 4.0 * 4096 * 1000});
    c.push_back({"max_dim1_4096x1000", "max with indices along rows of (4096, 1000)", {Op::MaxDim1, 1, 4096, 1000, 0},
                 Unit::GBytes, 4.0 * 4096 * 1000});
    c.push_back({"amax_dim1_4096x1000", "amax along rows of (4096, 1000)", {Op::AmaxDim1, 1, 4096, 1000, 0},
                 Unit::GBytes, 4.0 * 4096 * 1000});
    c.push_back(memory(Op::ToHalf, "to_f16_16M", "to(float16) 16M (4 bytes read, 2 written)", 1.5));
    c.push_back(memory(Op::FromHalf, "from_f16_16M", "float16 to(float32) 16M (2 bytes read, 4 written)", 1.5));
    c.push_back({"arange_4M", "arange(4096000), int64 (8 bytes written)", {Op::Arange, 1, 0, 4096000, 0},
                 Unit::GBytes, 8.0 * 4096000});
    c.push_back({"cat_dim1_4096x1000", "cat dim 1 of two (4096, 1000)", {Op::CatDim1, 1, 4096, 1000, 0}, Unit::GBytes,
                 4 * 4.0 * 4096 * 1000});
    c.push_back(reduction(Op::SumAll, "sum_4096x4096", "sum 4096x4096 (all)"));
    c.push_back(reduction(Op::SumDim0, "sum_4096x4096_dim0", "sum 4096x4096 (dim 0)"));
    c.push_back(reduction(Op::SumDim1, "sum_4096x4096_dim1", "sum 4096x4096 (dim 1)"));
    // rows and columns of 1000: the tails of the vector loops show, as in a classifier's logits
    c.push_back({"sum_dim0_4096x1000", "sum (4096, 1000) (dim 0)", {Op::SumDim0, 1, 4096, 1000, 0}, Unit::GBytes,
                 4.0 * 4096 * 1000});
    c.push_back({"sum_dim1_4096x1000", "sum (4096, 1000) (dim 1)", {Op::SumDim1, 1, 4096, 1000, 0}, Unit::GBytes,
                 4.0 * 4096 * 1000});
    // layers, forward + backward to the input and every parameter
    c.push_back(linear_train(2048, 768, 3072));  // a transformer MLP's up projection at 2048 tokens
    c.push_back(linear_train(256, 1024, 1024));  // bench_train's mlp
    // ResNet-50 at batch 8 (layer1 3x3, layer1 1x1 reduce, layer2 3x3, the stem), bench_train's cnn
    c.push_back(conv_train(8, {.c_in = 64, .c_out = 64, .h = 56, .w = 56, .kernel = 3, .stride = 1, .pad = 1}));
    c.push_back(conv_train(8, {.c_in = 256, .c_out = 64, .h = 56, .w = 56, .kernel = 1, .stride = 1, .pad = 0}));
    c.push_back(conv_train(8, {.c_in = 128, .c_out = 128, .h = 28, .w = 28, .kernel = 3, .stride = 1, .pad = 1}));
    c.push_back(conv_train(8, {.c_in = 3, .c_out = 64, .h = 224, .w = 224, .kernel = 7, .stride = 2, .pad = 3}));
    c.push_back(conv_train(32, {.c_in = 64, .c_out = 64, .h = 32, .w = 32, .kernel = 3, .stride = 1, .pad = 1}));
    // a video / volume block: native 3-d kernels, and composed of conv2d (Note [3-d over 2-d])
    for (const bool native : {true, false})
      c.push_back(conv3d_train(
          4, {.c_in = 16, .c_out = 32, .h = 32, .w = 32, .kernel = 3, .stride = 1, .pad = 1, .d = 16}, native));
    // a video network's stem pooling (R3D / I3D style): 3x3x3, stride 2, padding 1
    for (const bool is_max : {true, false})
      c.push_back(pool3d_train(
          4, {.c_in = 32, .c_out = 32, .h = 32, .w = 32, .kernel = 3, .stride = 2, .pad = 1, .d = 16}, is_max));
    {
      // x read twice (statistics, then normalize), y written, dy read, dx written: 5 tensors
      const int64_t rows = 16 * 128, cols = 768;
      c.push_back({"layernorm_train_2048x768", "layer_norm fwd+bwd (2048x768)", {Op::LayerNormTrain, 1, rows, cols, 0},
                   Unit::GBytes, 5 * 4.0 * rows * cols});
    }
    // x read, y written; y and dy read, dx written: 5 tensors, along rows of 1000 (logits)
    c.push_back({"softmax_train_4096x1000", "softmax fwd+bwd (4096x1000, dim 1)", {Op::SoftmaxTrain, 1, 4096, 1000, 0},
                 Unit::GBytes, 5 * 4.0 * 4096 * 1000});
    // two (T x T x D) products per head forward (q k^T, p v), counted dense despite the mask;
    // fused (strata's default) and composed (set_fused_attention off), at GPT-2 small's head
    // shape and at bench_train's gpt
    for (auto [b, h, t, d] : {std::array<int64_t, 4>{8, 12, 256, 64}, {16, 8, 128, 32}})
      for (const bool fused : {true, false}) {
        const std::string shape = fmt::format("{}x{}x{}x{}", b, h, t, d);
        c.push_back({fmt::format("attn_train_sdpa_causal_{}{}", shape, fused ? "" : "_composed"),
                     fmt::format("sdpa causal fwd+bwd {} {}", shape, fused ? "fused" : "composed"),
                     {fused ? Op::AttentionTrain : Op::AttentionComposedTrain, b, h, t, d}, Unit::GFlops,
                     3 * 4.0 * b * h * t * t * d});
      }
    c.push_back(optimizer_step(Op::AdamW, 10000000, "adamw", 28));
    c.push_back(optimizer_step(Op::AdamW, 100000000, "adamw", 28));
    c.push_back(optimizer_step(Op::SGDMomentum, 10000000, "sgd_momentum", 20));
    return c;
  }();
  return all;
}

// Per-iteration seconds of every repetition, by benchmark name.
std::map<std::string, std::vector<double>>& timings() {
  static std::map<std::string, std::vector<double>> t;
  return t;
}

class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred && r.iterations > 0)
        timings()[r.run_name.function_name].push_back(r.real_accumulated_time / static_cast<double>(r.iterations));
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

void add_benchmark(const std::string& name, const Case& c, std::function<Runner()> prepare) {
  const char* unit = c.unit == Unit::GFlops ? "GFLOP/s" : "GB/s";
  benchmark::RegisterBenchmark(name.c_str(), [prepare, unit, work = c.work](benchmark::State& state) {
    Runner run = prepare();
    if (!run) {
      state.SkipWithError("no equivalent workload");
      return;
    }
    run();  // warm-up: primitive caches, page faults of the first allocation
    for (auto _ : state) run();
    state.counters[unit] = benchmark::Counter(work * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  })->UseRealTime()->Unit(benchmark::kMillisecond);
}

std::string blas_target() {
  char buf[512];
  ssize_t n = readlink("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const char* env_threads = std::getenv("STRATA_BENCH_THREADS");
  const int threads = env_threads ? std::max(1, std::atoi(env_threads)) : 2;
  bench::restart_with_bench_env(argv, threads);
  strata::set_num_threads(threads);
  std::unique_ptr<bench::Peer> peer = bench::make_torch_peer();
  if (peer) peer->set_threads(threads);

  const bench::Ceiling peak = bench::measure_fma_peak(threads);
  const bench::Ceiling bandwidth = bench::measure_memcpy_bandwidth(threads, 4 * kElems);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
  fmt::print("strata op benchmarks, {}\nCPU: {}, {} threads for every library\n", date, bench::cpu_model(), threads);
  fmt::print("fp32 peak: {:.1f} GFLOP/s ({})\n", peak.value, peak.method);
  fmt::print("memory bandwidth: {:.1f} GB/s ({})\n", bandwidth.value, bandwidth.method);
  fmt::print("malloc: {}\n", bench::malloc_policy());
  fmt::print("peer: {}\n\n", peer ? fmt::format("{} (BLAS: {})", peer->name(), blas_target()) : "none (built without LibTorch)");

  for (const Case& c : cases()) {
    const Workload w = c.w;
    add_benchmark(c.id + "/strata", c, [w] { return bench::strata_runner(w); });
    if (peer) add_benchmark(c.id + "/torch", c, [w, p = peer.get()] { return p->prepare(w); });
  }
  benchmark::Initialize(&argc, argv);
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  // the summary: medians over repetitions
  fmt::print("\n{:<48} {:>8} {:>10} {:>10} {:>7} {:>9}\n", "case", "unit", "strata", peer ? "LibTorch" : "-",
             "ratio", "% of max");
  for (const Case& c : cases()) {
    auto s = timings().find(c.id + "/strata"), t = timings().find(c.id + "/torch");
    if (s == timings().end()) continue;  // filtered out
    double rs = c.work * 1e-9 / median(s->second);
    double rt = t != timings().end() ? c.work * 1e-9 / median(t->second) : 0;
    double ceiling = c.unit == Unit::GFlops ? peak.value : bandwidth.value;
    fmt::print("{:<48} {:>8} {:>10.1f} {:>10} {:>7} {:>8.0f}%\n", c.label, c.unit == Unit::GFlops ? "GFLOP/s" : "GB/s",
               rs, rt > 0 ? fmt::format("{:.1f}", rt) : "-", rt > 0 ? fmt::format("{:.2f}", rs / rt) : "-",
               100 * rs / ceiling);
  }
  fmt::print(
      "\nratio = strata / LibTorch (higher is better for strata); % of max = strata against the fp32 peak "
      "(GFLOP/s rows) or the memcpy bandwidth (GB/s rows).\n"
      "Counting: gemm 2mnk; linear and conv fwd+bwd 3 x forward FLOPs (2 x multiply-adds; backward to input, weight "
      "and bias); attention fwd+bwd 3 x 4 B H T^2 D (dense, the causal mask does not halve it); layer_norm fwd+bwd "
      "5 x 4 bytes per element (x read twice, y written, dy read, dx written; weight, bias and their grads not "
      "counted); softmax fwd+bwd 5 x 4 bytes per element (x read, y written, y and dy read, dx written); "
      "adamw 28 bytes/param (read p, g, m, v; write p, m, v); sgd_momentum 20 bytes/param (read p, g, "
      "buf; write p, buf).\n"
      "Layers: fp32, every input requires grad, a fixed upstream gradient, grads set to none each iteration, conv "
      "without bias (NCHW). Optimizers: step only, gradients present, lr 1e-3, AdamW weight decay 0.01, SGD "
      "momentum 0.9.\n"
      "sdpa: strata's nn::functional::scaled_dot_product_attention, fused (its default) or composed (with "
      "set_fused_attention off); LibTorch 1.13 has no fused SDPA, so its column is the composed math (matmul, "
      "/ sqrt(d), masked_fill, softmax, matmul) in both rows.\n"
      "conv3d: strata's native 3-d kernels (its default) or composed of conv2d (with set_native_conv3d off); "
      "LibTorch's column is at::conv3d in both rows.\n"
      "pool3d fwd+bwd: 4 x 4 bytes per element of x and y together (x read, y written, dy read, dx written; max "
      "pooling's indices not counted); LibTorch's column is at::max_pool3d / at::avg_pool3d.\n");
  return 0;
}
