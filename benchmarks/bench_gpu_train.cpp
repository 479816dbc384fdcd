// bench_gpu's training rows:
//   adamw      one strata::optim::AdamW step over 100M float32 parameters on the GPU, held in 50
//              tensors of 2M as a model's layers would be; GB/s counting 28 bytes per parameter
//              (parameter read and written, gradient read, both moments read and written), and
//              its share of the copy bandwidth (target: 70% or more)
//   gpt_train  whole training steps (forward, cross-entropy, zero_grad, backward, AdamW) of the
//              Transformer example's GPT (examples/transformer/gpt.hpp) at 6 layers, width 512,
//              8 heads, context 256, batch 32, float32 without TF32, on one fixed random batch;
//              tokens/s from the median step. Any op without a CUDA kernel makes the row
//              "unavailable: <message>". gpt_train_fused: the same with fused attention
//              switched on (kernels/cuda/attention.cu), beside PyTorch's gpt_train.
//   train_*    bench_train's workloads (mlp, cnn, resnet50 at batch 64, gpt) on the GPU: samples,
//              images or tokens per second from the median of whole training steps
#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

#include "bench_gpu.h"
#include "train_models.hpp"
#include "transformer/gpt.hpp"

namespace bench_gpu {

namespace st = strata;
namespace F = strata::nn::functional;

namespace {

void adamw_row(Context& ctx) {
  const long long total = scaled(ctx.settings, 100'000'000);
  constexpr long long kTensors = 50;
  Row row{.key = "adamw", .what = fmt::format("AdamW step, {:.0f}M f32 params", total / 1e6), .unit = "GB/s"};
  add_row(ctx, row, [&] {
    const auto opts = st::TensorOptions(st::kFloat32, st::Device::cuda());
    std::vector<st::Tensor> params;
    for (long long i = 0; i < kTensors; ++i) {
      const long long n = total / kTensors + (i < total % kTensors ? 1 : 0);
      st::Tensor p = st::randn({n}, opts);
      p.requires_grad_();
      p.set_grad(st::randn({n}, opts));
      params.push_back(p);
    }
    st::optim::AdamW opt(params, st::optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
    const double ms = median_ms(ctx.settings, [&] { opt.step(); });
    return 28.0 * static_cast<double>(total) / (ms * 1e-3) / 1e9;
  });
  Row& added = ctx.rows.back();
  if (added.note.empty()) added.note = percent_of_copy(ctx, added.value);
}

// fused: with set_fused_attention on for CUDA (the row gpt_train_fused), which is off by default
// until its kernels have run on a GPU.
void gpt_row(Context& ctx, bool fused) {
  const gpt::Config config{.vocab = 256, .context = 256, .layers = 6, .width = 512, .heads = 8};
  const int64_t batch = 32;
  double first_loss = NAN, last_loss = NAN;
  Row row{.key = fused ? "gpt_train_fused" : "gpt_train",
          .what = fused ? "GPT train step 6x512, ctx 256, batch 32, f32, fused attention"
                        : "GPT train step 6x512, ctx 256, batch 32, f32",
          .unit = "tokens/s"};
  add_row(ctx, row, [&] {
    const F::FusedAttentionGuard fused_switch(st::DeviceType::CUDA, fused);  // restored however the row ends
    const st::Device cuda = st::Device::cuda();
    st::manual_seed(1);
    gpt::GPT model(config);
    model.to(cuda);
    st::optim::AdamW opt(model.parameters(), st::optim::AdamWOptions{.lr = 3e-4, .weight_decay = 0.01});
    const auto ints = st::TensorOptions(st::kInt64, cuda);
    st::Tensor x = st::randint(0, config.vocab, {batch, config.context}, ints);
    st::Tensor y = st::randint(0, config.vocab, {batch * config.context}, ints);
    auto step = [&] {
      st::Tensor loss = F::cross_entropy(model(x).flatten(0, 1), y);  // (B * T, vocab) logits
      opt.zero_grad();
      loss.backward();
      opt.step();
      return loss.item<double>();  // waits for the step
    };
    first_loss = step();
    for (int i = 1; i < ctx.settings.warmup; ++i) step();
    std::vector<double> seconds;
    for (int i = 0; i < ctx.settings.reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      last_loss = step();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!std::isfinite(last_loss)) throw std::runtime_error(fmt::format("[gpt_train] the loss became {}", last_loss));
    std::sort(seconds.begin(), seconds.end());
    const size_t n = seconds.size();
    const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
    return static_cast<double>(batch * config.context) / median;
  });
  Row& added = ctx.rows.back();
  if (added.note.empty())
    added.note = fmt::format("loss {:.3f} -> {:.3f} over {} steps", first_loss, last_loss,
                             std::max(1, ctx.settings.warmup) + ctx.settings.reps);
}

// bench_train's four workloads (benchmarks/train_models.hpp) trained on the GPU: whole steps
// on one fixed synthetic batch, units per second from the median step.
void train_rows(Context& ctx) {
  struct Workload {
    const char* key;
    bench::Model model;
    int64_t batch, units_per_sample;
    const char* what;
    const char* unit;
  };
  const Workload workloads[] = {
      {"train_mlp", bench::Model::Mlp, 256, 1, "mlp 784-1024-1024-10, batch 256, AdamW", "samples/s"},
      {"train_cnn", bench::Model::Cnn, 32, 1, "cnn ResNet-style 3x32x32, batch 32, SGD", "samples/s"},
      {"train_resnet50", bench::Model::ResNet50, 64, 1, "resnet50 224x224, batch 64, SGD", "images/s"},
      {"train_gpt", bench::Model::Gpt, 16, bench::kGptContext, "gpt 6x256, ctx 128, batch 16, AdamW", "tokens/s"},
  };
  const std::vector<std::string>& only = ctx.settings.workloads;
  for (const Workload& w : workloads) {
    const std::string name = std::string(w.key).substr(6);  // without "train_"
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    add_row(ctx, Row{.key = w.key, .what = w.what, .unit = w.unit}, [&] {
      auto trainer = bench::make_strata_trainer({.model = w.model, .batch = w.batch, .seed = 1, .cuda = true});
      for (int i = 0; i < std::max(1, ctx.settings.warmup); ++i) trainer->step();
      std::vector<double> seconds;
      for (int i = 0; i < ctx.settings.reps; ++i) {
        const double t0 = bench::now_seconds();
        trainer->step();  // ends by reading the loss
        seconds.push_back(bench::now_seconds() - t0);
      }
      std::sort(seconds.begin(), seconds.end());
      const size_t n = seconds.size();
      const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
      return static_cast<double>(w.batch * w.units_per_sample) / median;
    });
    st::cuda::empty_cache();
  }
}

}  // namespace

void run_training_rows(Context& ctx) {
  if (wants(ctx.settings, "adamw")) adamw_row(ctx);
  st::cuda::empty_cache();
  if (wants(ctx.settings, "gpt")) gpt_row(ctx, false);
  if (wants(ctx.settings, "gpt_fused")) gpt_row(ctx, true);
  st::cuda::empty_cache();
  if (wants(ctx.settings, "train")) train_rows(ctx);
}

}  // namespace bench_gpu
