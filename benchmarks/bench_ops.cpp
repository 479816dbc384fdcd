// The op benchmark table: strata beside LibTorch (when built with it) on GEMM, elementwise
// and reduction workloads, in one process, with repetitions interleaved (run with
// --benchmark_enable_random_interleaving=true, as scripts/bench.sh does) so both libraries
// see the same machine noise. Ends with a summary of medians: GEMM in GFLOP/s against the
// measured FMA peak, memory-bound ops in GB/s against the measured memcpy bandwidth.
//
//   STRATA_BENCH_THREADS   threads for both libraries (default 2)
#include <unistd.h>

#include <algorithm>
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
    c.push_back(reduction(Op::SumAll, "sum_4096x4096", "sum 4096x4096 (all)"));
    c.push_back(reduction(Op::SumDim0, "sum_4096x4096_dim0", "sum 4096x4096 (dim 0)"));
    c.push_back(reduction(Op::SumDim1, "sum_4096x4096_dim1", "sum 4096x4096 (dim 1)"));
    return c;
  }();
  return all;
}

Runner strata_runner(const Workload& w) {
  namespace st = strata;
  switch (w.op) {
    case Op::Matmul: {
      st::Tensor a = st::rand({w.m, w.k}), b = st::rand({w.k, w.n});
      return [a, b] { st::matmul(a, b); };
    }
    case Op::MatmulNT: {
      st::Tensor a = st::rand({w.m, w.k}), b = st::rand({w.n, w.k});
      return [a, b] { st::matmul(a, b.t()); };
    }
    case Op::BatchedNT: {
      st::Tensor a = st::rand({w.b, w.m, w.k}), b = st::rand({w.b, w.n, w.k});
      return [a, b] { st::matmul(a, b.transpose(1, 2)); };
    }
    case Op::Add: case Op::Mul: case Op::AddInPlace: {
      st::Tensor a = st::rand({w.n}), b = st::rand({w.n});
      if (w.op == Op::Add) return [a, b] { st::add(a, b); };
      if (w.op == Op::Mul) return [a, b] { st::mul(a, b); };
      return [a, b]() mutable { a.add_(b); };
    }
    case Op::Exp: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::exp(a); };
    }
    case Op::Gelu: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::gelu(a); };
    }
    case Op::SumAll: case Op::SumDim0: case Op::SumDim1: {
      st::Tensor a = st::rand({w.m, w.n});
      if (w.op == Op::SumAll) return [a] { st::sum(a); };
      if (w.op == Op::SumDim0) return [a] { st::sum(a, {0}); };
      return [a] { st::sum(a, {1}); };
    }
  }
  return nullptr;
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
  // OpenBLAS and OpenMP read their thread counts once, at load: restart with them set
  if (!std::getenv("OPENBLAS_NUM_THREADS")) {
    std::string t = std::to_string(threads);
    setenv("OPENBLAS_NUM_THREADS", t.c_str(), 1);
    setenv("OMP_NUM_THREADS", t.c_str(), 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then carry on as we are
  }
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
  fmt::print("peer: {}\n\n", peer ? fmt::format("{} (BLAS: {})", peer->name(), blas_target()) : "none (built without LibTorch)");

  for (const Case& c : cases()) {
    const Workload w = c.w;
    add_benchmark(c.id + "/strata", c, [w] { return strata_runner(w); });
    if (peer) add_benchmark(c.id + "/torch", c, [w, p = peer.get()] { return p->prepare(w); });
  }
  benchmark::Initialize(&argc, argv);
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  // the summary: medians over repetitions
  fmt::print("\n{:<34} {:>8} {:>10} {:>10} {:>7} {:>9}\n", "case", "unit", "strata", peer ? "LibTorch" : "-",
             "ratio", "% of max");
  for (const Case& c : cases()) {
    auto s = timings().find(c.id + "/strata"), t = timings().find(c.id + "/torch");
    if (s == timings().end()) continue;  // filtered out
    double rs = c.work * 1e-9 / median(s->second);
    double rt = t != timings().end() ? c.work * 1e-9 / median(t->second) : 0;
    double ceiling = c.unit == Unit::GFlops ? peak.value : bandwidth.value;
    fmt::print("{:<34} {:>8} {:>10.1f} {:>10} {:>7} {:>8.0f}%\n", c.label, c.unit == Unit::GFlops ? "GFLOP/s" : "GB/s",
               rs, rt > 0 ? fmt::format("{:.1f}", rt) : "-", rt > 0 ? fmt::format("{:.2f}", rs / rt) : "-",
               100 * rs / ceiling);
  }
  fmt::print("\nratio = strata / LibTorch (higher is better for strata); % of max = strata against the fp32 peak "
             "(GEMM) or the memcpy bandwidth (memory-bound ops).\n");
  return 0;
}
