// bench_gpu: what strata reaches on one GPU, against the GPU's own ceilings, in one table.
//   copy         device-to-device cudaMemcpyAsync of 1 GiB: the memory ceiling (GB/s, read + write)
//   elementwise  add, mul, exp, gelu(tanh) on 256M float32 elements, add on bfloat16: GB/s
//   reduce       row sums, column sums and the full sum of a 16384 x 16384 float32 matrix: GB/s
//   gemm         strata::matmul beside a direct cuBLASLt call (bench_gpu_gemm.cpp): TFLOP/s
//   adamw        strata::optim::AdamW on 100M float32 parameters: GB/s at 28 bytes per parameter
//   gpt          a training step of a 6-layer GPT, width 512, context 256, batch 32: tokens/s
//   gpt_fused    the same with fused attention switched on for CUDA (off by default)
//   train        bench_train's mlp, cnn, resnet50 (batch 64) and gpt trained on the GPU: units/s
// GPU rows are medians of CUDA-event timings after warm-up. Besides the table it prints one
// "RESULT<TAB>key<TAB>value<TAB>unit<TAB>note" line per row as soon as the row is measured, so
// a run stopped by gpu-check's time limit keeps the rows it finished; bench_gpu_torch.py
// prints the same keys for PyTorch, and scripts/gpu-check.sh joins the two.
//
//   bench_gpu [--only copy,elementwise,reduce,gemm,adamw,gpt,gpt_fused,train] [--workloads mlp,cnn,resnet50,gpt]
//             [--reps N] [--warmup N]
//             [--scale F] [--list]
// Without a visible GPU it says so and exits 0; exit 1 when a row could not run, 2 on bad
// arguments.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <strata/strata.hpp>

#include "arg_reader.h"
#include "bench_gpu.h"

namespace bench_gpu {

namespace st = strata;

double median_ms(const Settings& settings, const std::function<void()>& fn) {
  for (int i = 0; i < settings.warmup; ++i) fn();
  std::vector<st::cuda::Event> events;
  for (int i = 0; i <= settings.reps; ++i) events.emplace_back(/*enable_timing=*/true);
  events[0].record();
  for (int i = 0; i < settings.reps; ++i) {
    fn();
    events[i + 1].record();
  }
  events.back().synchronize();
  std::vector<double> ms;
  for (int i = 0; i < settings.reps; ++i) ms.push_back(events[i].elapsed_time(events[i + 1]));
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

void add_row(Context& ctx, Row row, const std::function<double()>& measure) {
  std::printf("  %-44s ", row.what.c_str());
  std::fflush(stdout);
  try {
    row.value = measure();
    std::printf("%10.1f %s\n", row.value, row.unit.c_str());
  } catch (const std::exception& e) {
    row.value = NAN;
    row.note = fmt::format("unavailable: {}", e.what());
    std::printf("%s\n", row.note.c_str());
  }
  // the machine-readable line right away: a run cut short by its time limit keeps its rows
  std::printf("RESULT\t%s\t%.3f\t%s\t%s\n", row.key.c_str(), row.value, row.unit.c_str(), row.note.c_str());
  std::fflush(stdout);
  ctx.rows.push_back(std::move(row));
}

std::string percent_of_copy(const Context& ctx, double gbps) {
  if (std::isnan(ctx.copy_gbps) || std::isnan(gbps)) return "";
  return fmt::format("{:.0f}% of copy", 100.0 * gbps / ctx.copy_gbps);
}

long long scaled(const Settings& settings, long long nominal) {
  return std::max(1024LL, static_cast<long long>(static_cast<double>(nominal) * settings.scale));
}

bool wants(const Settings& settings, const std::string& section) {
  return settings.sections.empty() ||
         std::find(settings.sections.begin(), settings.sections.end(), section) != settings.sections.end();
}

namespace {

cudaStream_t current_stream() { return static_cast<cudaStream_t>(st::cuda::Stream::current().handle()); }

// Bandwidth row of a strata op over `bytes` moved per call, after `prepare` (untimed) made its
// inputs; its note is the share of the copy.
void bandwidth_row(Context& ctx, const std::string& key, const std::string& what, double bytes,
                   const std::function<void()>& prepare, const std::function<void()>& fn) {
  add_row(ctx, Row{.key = key, .what = what, .unit = "GB/s"}, [&] {
    prepare();
    return bytes / (median_ms(ctx.settings, fn) * 1e-3) / 1e9;
  });
  Row& row = ctx.rows.back();
  if (row.note.empty()) row.note = percent_of_copy(ctx, row.value);
}

void copy_row(Context& ctx) {
  const long long bytes = scaled(ctx.settings, 1LL << 30);
  Row row{.key = "copy",
          .what = fmt::format("D2D copy {} MiB (cudaMemcpyAsync)", bytes >> 20),
          .unit = "GB/s",
          .note = "read + write: the ceiling"};
  add_row(ctx, row, [&] {
    const auto opts = st::TensorOptions(st::kUInt8, st::Device::cuda());
    st::Tensor src = st::empty({bytes}, opts), dst = st::empty({bytes}, opts);
    const double ms = median_ms(ctx.settings, [&] {
      const cudaError_t e = cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes),
                                            cudaMemcpyDeviceToDevice, current_stream());
      if (e != cudaSuccess) throw std::runtime_error(fmt::format("[copy] cudaMemcpyAsync: {}", cudaGetErrorString(e)));
    });
    return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  });
  ctx.copy_gbps = ctx.rows.back().value;
}

// Inputs are made by the first row that needs them, so a failure there shows in the rows.
void elementwise_rows(Context& ctx) {
  const long long n = scaled(ctx.settings, 256LL << 20);
  const std::string size = fmt::format("{}M", n >> 20);
  st::Tensor a, b, out;
  auto inputs = [&](st::DType dtype) {
    if (!a.defined() || a.dtype() != dtype) {
      a = b = out = st::Tensor();  // free the previous pair first
      const auto opts = st::TensorOptions(dtype, st::Device::cuda());
      a = st::randn({n}, opts), b = st::randn({n}, opts);
    }
  };
  const double f32 = 4.0 * static_cast<double>(n), bf16 = 2.0 * static_cast<double>(n);
  auto float32 = [&] { inputs(st::kFloat32); };
  bandwidth_row(ctx, "add_f32", "add f32 " + size, 3 * f32, float32, [&] { out = st::add(a, b); });
  bandwidth_row(ctx, "mul_f32", "mul f32 " + size, 3 * f32, float32, [&] { out = st::mul(a, b); });
  bandwidth_row(ctx, "exp_f32", "exp f32 " + size, 2 * f32, float32, [&] { out = st::exp(a); });
  bandwidth_row(ctx, "gelu_tanh_f32", "gelu(tanh) f32 " + size, 2 * f32, float32, [&] { out = st::gelu(a, "tanh"); });
  bandwidth_row(
      ctx, "add_bf16", "add bf16 " + size, 3 * bf16, [&] { inputs(st::kBFloat16); }, [&] { out = st::add(a, b); });
}

void reduce_rows(Context& ctx) {
  const long long cols = 16384, rows = std::max(1LL, scaled(ctx.settings, cols * cols) / cols);
  const std::string shape = fmt::format("{}x{}", rows, cols);
  const double in = 4.0 * static_cast<double>(rows * cols);
  st::Tensor x, out;
  auto input = [&] {
    if (!x.defined()) x = st::randn({rows, cols}, st::TensorOptions(st::kFloat32, st::Device::cuda()));
  };
  bandwidth_row(ctx, "sum_rows_f32", "row sums f32 " + shape + " (dim 1)", in + 4.0 * rows, input,
                [&] { out = st::sum(x, {1}); });
  bandwidth_row(ctx, "sum_cols_f32", "column sums f32 " + shape + " (dim 0)", in + 4.0 * cols, input,
                [&] { out = st::sum(x, {0}); });
  bandwidth_row(ctx, "sum_all_f32", "full sum f32 " + shape, in + 4.0, input, [&] { out = st::sum(x); });
}

}  // namespace

void run_memory_rows(Context& ctx) {
  if (wants(ctx.settings, "copy")) copy_row(ctx);
  if (wants(ctx.settings, "elementwise")) elementwise_rows(ctx);
  if (wants(ctx.settings, "reduce")) reduce_rows(ctx);
  st::cuda::empty_cache();  // the next sections start from an empty pool
}

}  // namespace bench_gpu

namespace {

using namespace bench_gpu;

// The usage line for --help and for errors; the sections come from kSections.
std::string usage_text() {
  return fmt::format(
      "usage: bench_gpu [--only {}] [--workloads mlp,cnn,resnet50,gpt] [--reps N] [--warmup N] [--scale F] [--list]\n",
      fmt::join(kSections, ","));
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_gpu: %s\n%s", why.c_str(), usage_text().c_str());
  std::exit(2);
}

Settings parse(int argc, char** argv, bool& list_only) {
  Settings s;
  const bench::ArgReader args(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only") {
      std::stringstream list(args.value(i));
      for (std::string name; std::getline(list, name, ',');) {
        if (std::find(kSections.begin(), kSections.end(), name) == kSections.end())
          usage(fmt::format("unknown section '{}' ({})", name, fmt::join(kSections, ", ")));
        s.sections.push_back(name);
      }
    } else if (a == "--workloads") {
      std::stringstream list(args.value(i));
      for (std::string name; std::getline(list, name, ',');) {
        if (name != "mlp" && name != "cnn" && name != "resnet50" && name != "gpt")
          usage(fmt::format("unknown workload '{}' (mlp, cnn, resnet50, gpt)", name));
        s.workloads.push_back(name);
      }
    } else if (a == "--reps") {
      s.reps = args.count(i, 1, 100000);
    } else if (a == "--warmup") {
      s.warmup = args.count(i, 0, 100000);
    } else if (a == "--scale") {
      const std::string v = args.value(i);
      char* end = nullptr;
      s.scale = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(s.scale > 0) || s.scale > 4)
        usage("--scale takes a number in (0, 4], not '" + v + "'");
    } else if (a == "--list") {
      list_only = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", usage_text().c_str());
      std::exit(0);
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bool list_only = false;
  Context ctx{.settings = parse(argc, argv, list_only)};
  if (list_only) {
    for (const std::string& s : kSections)
      if (wants(ctx.settings, s)) std::printf("%s\n", s.c_str());
    return 0;
  }
  if (!strata::cuda::is_available()) {
    std::printf("bench_gpu: no GPU visible to strata (CUDA device count 0): nothing to measure\n");
    return 0;
  }
  try {
    const auto p = strata::cuda::get_device_properties();
    std::printf(
        "bench_gpu on %s (compute capability %d.%d, %d multiprocessors, %.0f GiB); %d warm-up runs, median "
        "of %d, scale %g\n",
        p.name.c_str(), p.major, p.minor, p.multiprocessor_count, p.total_memory / 1073741824.0, ctx.settings.warmup,
        ctx.settings.reps, ctx.settings.scale);
    run_memory_rows(ctx);
    run_gemm_rows(ctx);
    run_training_rows(ctx);
  } catch (const std::exception& e) {  // outside any row: the device itself failed
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  std::printf("\n%-20s %-44s %10s %-9s %s\n", "key", "row", "value", "unit", "note");
  bool all_ran = true;
  for (const Row& r : ctx.rows) {
    std::printf("%-20s %-44s %10.1f %-9s %s\n", r.key.c_str(), r.what.c_str(), r.value, r.unit.c_str(), r.note.c_str());
    all_ran = all_ran && !std::isnan(r.value);
  }
  std::printf("\n");
  return all_ran ? 0 : 1;
}
