// End-to-end training throughput: each workload (mlp, cnn, resnet50, gpt) trained by strata
// and, where the benchmark was built with LibTorch, by its LibTorch twin (train_torch.cpp),
// in one process. After warm-up steps the two libraries run timed rounds of N full training
// steps in turn (strata first in even rounds, LibTorch first in odd ones), so both see the
// same machine noise; the table shows each library's median samples/s (tokens/s for gpt)
// and the ratio strata / LibTorch. Every step trains on one fixed synthetic batch (fixed
// seed), so data loading is not measured.
//
//   bench_train [--workloads mlp,cnn,resnet50,gpt] [--steps N] [--rounds R] [--warmup W]
//               [--device cpu|cuda] [--phases] [--ops]
//   --phases  after the rounds, times forward + loss, backward and the optimizer step apart (CPU)
//   --ops     after the rounds, strata's time per op (kernel) and per op and input shapes (CPU)
//   STRATA_BENCH_THREADS   threads for both libraries (default 2)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

#include "arg_reader.h"
#include "machine.h"
#include "resnet50/model.hpp"
#include "train_models.hpp"
#include "train_op_times.hpp"
#include "train_workload.h"
#include "transformer/gpt.hpp"

namespace bench {

namespace {

struct Workload {
  std::string name;
  Model model;
  int64_t batch;
  int64_t per_sample;  // units per sample: tokens for gpt, 1 otherwise
  std::string unit;
  int warmup, steps, rounds;  // defaults sized so the whole CPU run takes a few minutes
};

std::vector<Workload> workloads(bool cuda) {
  std::vector<Workload> all = {
      {"mlp", Model::Mlp, 256, 1, "samples/s", 5, 20, 5},
      {"cnn", Model::Cnn, 32, 1, "samples/s", 2, 4, 5},
      {"resnet50", Model::ResNet50, cuda ? 64 : 8, 1, "images/s", 1, 2, 3},
      {"gpt", Model::Gpt, 16, kGptContext, "tokens/s", 2, 4, 5},
  };
  // a GPU step takes milliseconds: more warm-up (the caching allocator's growth, cuDNN's first
  // calls) and rounds long enough to time
  if (cuda)
    for (Workload& w : all) w.warmup = std::max(w.warmup, 5), w.steps = std::max(w.steps, 20);
  return all;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Units per second over `steps` steps.
double timed_round(Trainer& t, int steps, double units_per_step, double& last_loss) {
  const double t0 = now_seconds();
  for (int i = 0; i < steps; ++i) last_loss = t.step();
  return units_per_step * steps / (now_seconds() - t0);
}

std::string format_rate(double v) { return v >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.2f}", v); }

struct Row {
  std::string name, unit, strata, torch, ratio;
};

struct Options {
  std::vector<std::string> names;
  int steps = 0, rounds = 0, warmup = -1;  // 0 / -1: each workload's default
  bool cuda = false, phases = false, ops = false;
};

constexpr const char* kUsage =
    "usage: bench_train [--workloads mlp,cnn,resnet50,gpt] [--steps N] [--rounds R] [--warmup W] "
    "[--device cpu|cuda] [--phases] [--ops]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_train: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  const bench::ArgReader args(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workloads") {
      std::stringstream list(args.value(i));
      for (std::string w; std::getline(list, w, ',');) o.names.push_back(w);
    } else if (a == "--steps") {
      o.steps = args.count(i, 1, 1000000);
    } else if (a == "--rounds") {
      o.rounds = args.count(i, 1, 1000000);
    } else if (a == "--warmup") {
      o.warmup = args.count(i, 0, 1000000);
    } else if (a == "--device") {
      const std::string d = args.value(i);
      if (d != "cpu" && d != "cuda") usage("--device is cpu or cuda, not '" + d + "'");
      o.cuda = d == "cuda";
    } else if (a == "--phases") {
      o.phases = true;
    } else if (a == "--ops") {
      o.ops = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  // their clocks are read without waiting for the device: on a GPU they would time launches
  if (o.cuda && (o.phases || o.ops)) usage("--phases and --ops time CPU runs only (not --device cuda)");
  for (const std::string& n : o.names) {
    const auto all = workloads(false);
    if (std::none_of(all.begin(), all.end(), [&](const Workload& w) { return w.name == n; }))
      usage("unknown workload '" + n + "' (mlp, cnn, resnet50, gpt)");
  }
  return o;
}

// strata can use the GPU when a small matmul runs there (without a GPU, or in a build without
// CUDA, it raises an Error saying why).
bool strata_gpu_works(std::string& why) {
  try {
    st::Tensor probe = st::ones({4, 4}, st::TensorOptions().device(st::Device::cuda()));
    (st::matmul(probe, probe).sum() + 1).item<float>();
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

// Each library trains `phase_steps` more steps with its phases timed; prints ms per step.
void print_phases(const std::string& lib, Trainer& t, int phase_steps) {
  double p[3] = {0, 0, 0};
  for (int i = 0; i < phase_steps; ++i) t.step(p);
  const double total = p[0] + p[1] + p[2];
  std::printf("  phases %-13s forward+loss %8.1f ms (%4.1f%%)  zero_grad+backward %8.1f ms (%4.1f%%)  "
              "optimizer %7.1f ms (%4.1f%%)\n",
              lib.c_str(), 1e3 * p[0] / phase_steps, 100 * p[0] / total, 1e3 * p[1] / phase_steps, 100 * p[1] / total,
              1e3 * p[2] / phase_steps, 100 * p[2] / total);
}

Row run(const Workload& w, const Options& o, const std::string& torch) {
  const int steps = o.steps > 0 ? o.steps : w.steps, rounds = o.rounds > 0 ? o.rounds : w.rounds;
  const int warmup = std::max(o.warmup >= 0 ? o.warmup : w.warmup, 1);  // at least one step, for the first loss
  const TrainConfig cfg{.model = w.model, .batch = w.batch, .seed = 1, .cuda = o.cuda};
  auto s = make_strata_trainer(cfg);
  auto t = torch.empty() ? nullptr : make_torch_trainer(cfg);
  std::printf("\n%s: batch %lld, %d warm-up steps, %d rounds of %d steps; parameters: strata %lld", w.name.c_str(),
              (long long)w.batch, warmup, rounds, steps, (long long)s->num_parameters());
  if (t) std::printf(", %s %lld", torch.c_str(), (long long)t->num_parameters());
  std::printf("\n");
  STRATA_CHECK(!t || t->num_parameters() == s->num_parameters(),
               "[bench_train] {}: the two models differ ({} against {} parameters)", w.name, s->num_parameters(),
               t->num_parameters());
  double s_loss = 0, t_loss = 0, s_first = 0, t_first = 0;
  for (int i = 0; i < warmup; ++i) {
    const double l = s->step();
    if (i == 0) s_first = l;
    if (t) {
      const double m = t->step();
      if (i == 0) t_first = m;
    }
  }
  const double units = static_cast<double>(w.batch * w.per_sample);
  std::vector<double> s_rates, t_rates;
  for (int r = 0; r < rounds; ++r) {
    auto strata_round = [&] { s_rates.push_back(timed_round(*s, steps, units, s_loss)); };
    auto torch_round = [&] {
      if (t) t_rates.push_back(timed_round(*t, steps, units, t_loss));
    };
    if (r % 2 == 0) strata_round(), torch_round();
    else torch_round(), strata_round();
    std::printf("  round %d/%d  strata %10s", r + 1, rounds, format_rate(s_rates.back()).c_str());
    if (t) std::printf("  %s %10s", torch.c_str(), format_rate(t_rates.back()).c_str());
    std::printf("  %s\n", w.unit.c_str());
    std::fflush(stdout);
  }
  std::printf("  loss: strata %.4f -> %.4f", s_first, s_loss);
  if (t) std::printf(", %s %.4f -> %.4f", torch.c_str(), t_first, t_loss);
  std::printf(" (one batch, seen again each step)\n");
  // a run that diverged may skip work (NaN paths) or not: its rates are not reported
  STRATA_CHECK(std::isfinite(s_loss) && (!t || std::isfinite(t_loss)),
               "[bench_train] {}: the training loss is not finite (strata {}, LibTorch {})", w.name, s_loss, t_loss);
  if (o.phases) {
    print_phases("strata", *s, steps);
    if (t) print_phases(torch, *t, steps);
  }
  if (o.ops) {
    OpTimes times;
    const double t0 = now_seconds();
    for (int i = 0; i < steps; ++i) s->step();
    times.print(steps, now_seconds() - t0, 15);
  }
  Row row{w.name, w.unit, format_rate(median(s_rates)), "", ""};
  if (t) row.torch = format_rate(median(t_rates)), row.ratio = fmt::format("{:.2f}x", median(s_rates) / median(t_rates));
  return row;
}

}  // namespace

}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  try {
    const Options o = parse(argc, argv);
    const char* env = std::getenv("STRATA_BENCH_THREADS");
    const int threads = env ? std::max(1, std::atoi(env)) : 2;
    restart_with_bench_env(argv, threads);
    std::string command = argv[0];
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const auto getenv_or = [](const char* name) { const char* v = std::getenv(name); return v ? v : "(unset)"; };
    std::printf("command: %s\nCPU: %s; threads: %d for both libraries (OMP_NUM_THREADS=%s, OPENBLAS_NUM_THREADS=%s)\n",
                command.c_str(), cpu_model().c_str(), threads, getenv_or("OMP_NUM_THREADS"),
                getenv_or("OPENBLAS_NUM_THREADS"));
    std::printf("malloc: %s\n", malloc_policy().c_str());
    if (o.cuda) {
      std::string why;
      if (!strata_gpu_works(why)) {
        std::printf("--device cuda: skipped, strata cannot train on the GPU in this build: %s\n", why.c_str());
        return 0;
      }
    }
    strata::set_num_threads(threads);
    torch_set_threads(threads);
    std::string torch = torch_name();
    if (torch.empty()) std::printf("LibTorch: not built with it; strata alone\n");

    std::vector<Row> rows;
    for (const Workload& w : workloads(o.cuda))
      if (o.names.empty() || std::find(o.names.begin(), o.names.end(), w.name) != o.names.end())
        rows.push_back(run(w, o, torch));

    std::printf("\nEnd-to-end training, %s, %d threads, median of the rounds (ratio: strata / %s)\n",
                o.cuda ? "GPU" : "CPU fp32", threads, torch.empty() ? "LibTorch" : torch.c_str());
    std::printf("| workload | strata | %s | ratio | unit |\n|---|---:|---:|---:|---|\n",
                torch.empty() ? "LibTorch" : torch.c_str());
    for (const Row& r : rows)
      std::printf("| %s | %s | %s | %s | %s |\n", r.name.c_str(), r.strata.c_str(), r.torch.empty() ? "n/a" : r.torch.c_str(),
                  r.ratio.empty() ? "n/a" : r.ratio.c_str(), r.unit.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
}
