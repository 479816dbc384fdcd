// The example's training loop: options, the learning-rate schedule, the optimizer, batches
// of random windows from the token shards, validation, checkpoints and text sampling.
//
// Note [Exact resume]: everything a step depends on is either a function of the step (the
// learning rate) or saved in the checkpoint (model, optimizer, the data generator and the
// default generator, which dropout draws from). Validation and sampling use fresh generators
// with fixed seeds, so they draw nothing from saved state. The metrics CSV holds one row per
// step, so a resumed run's rows equal those of an uninterrupted one; the running mean on the
// progress lines is for display only.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "checkpointing.hpp"
#include "corpus.hpp"
#include "gpt.hpp"
#include "profiling.hpp"

namespace st = strata;
namespace F = strata::nn::functional;

struct Options {
  gpt::Config model;
  int64_t batch = 16;
  int64_t steps = 800;
  int64_t stop_after = 0;  // stop (with a checkpoint) after this step; the schedule still spans `steps`
  double lr = 2e-3;
  double min_lr = 3e-4;
  int64_t warmup = 50;
  double weight_decay = 0.1;
  double clip = 1.0;
  std::string optimizer = "adamw";
  std::string device = "auto";
  uint64_t seed = 1337;
  int64_t log_every = 50;
  int64_t eval_every = 200;
  int64_t eval_batches = 20;
  std::string train_data = "data/fortunes-train.bin";
  std::string val_data = "data/fortunes-val.bin";
  std::string checkpoint = "transformer.ckpt.safetensors";
  bool resume = false;
  bool amp = false;
  std::string weights = "model.safetensors";
  std::string metrics = "transformer_metrics.csv";
  int64_t sample_tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 20;
  int threads = 0;
  std::string profile;  // Chrome trace of a few profiled steps (profiling.hpp); empty: no profiling
  bool cuda_graphs = false;  // replay each training step as one CUDA graph (GraphedStep)
};

// Linear warmup to lr, then cosine decay to min_lr.
inline double lr_at(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  double progress = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + std::cos(M_PI * std::min(progress, 1.0)));
}

// Decay on matrices only (not on biases, norms), as is usual for Transformers.
template <class Opt, class OptOptions>
std::unique_ptr<st::optim::Optimizer> grouped(gpt::GPT& model, OptOptions decay) {
  OptOptions no_decay = decay;
  no_decay.weight_decay = 0;
  std::vector<st::Tensor> matrices, others;
  for (const st::Tensor& p : model.parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
  return std::make_unique<Opt>(std::vector<typename Opt::Group>{{matrices, decay}, {others, no_decay}}, decay);
}

inline std::unique_ptr<st::optim::Optimizer> make_optimizer(gpt::GPT& model, const Options& o) {
  if (o.optimizer == "lamb")
    return grouped<st::optim::LAMB>(model, st::optim::LAMBOptions{.lr = o.lr, .weight_decay = o.weight_decay});
  if (o.optimizer == "adam8bit")
    return grouped<st::optim::Adam8bit>(model, st::optim::Adam8bitOptions{.lr = o.lr, .weight_decay = o.weight_decay});
  return grouped<st::optim::AdamW>(model,
                                   st::optim::AdamWOptions{.lr = o.lr, .betas = {0.9, 0.95}, .weight_decay = o.weight_decay});
}

// `batch` random windows: (input, target), each (batch, context) int64 on the CPU.
inline std::pair<st::Tensor, st::Tensor> random_batch(const st::data::TokenWindowDataset& data, int64_t batch,
                                                      st::Generator& g) {
  std::vector<st::Tensor> xs, ys;
  for (int64_t i = 0; i < batch; ++i) {
    st::data::Example e = data.random_window(g);
    xs.push_back(e.input);
    ys.push_back(e.target);
  }
  return {st::stack(xs), st::stack(ys)};
}

inline double evaluate(gpt::GPT& model, const st::data::TokenWindowDataset& data, const Options& o, st::Device device) {
  st::NoGradGuard no_grad;
  model.eval();
  st::Generator g(o.seed + 1);  // the same validation windows every time
  double total = 0;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    auto [x, y] = random_batch(data, o.batch, g);
    st::Tensor logits = model(x.to(device));
    total += F::cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item<double>();
  }
  model.train();
  return total / static_cast<double>(o.eval_batches);
}

inline std::string sample(gpt::GPT& model, const std::string& prompt, const Options& o, st::Device device) {
  st::NoGradGuard no_grad;
  model.eval();
  st::Generator g(o.seed + 2);
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  std::string out = prompt;
  for (int64_t i = 0; i < o.sample_tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - o.model.context);
    std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    st::Tensor x = st::from_vector<int64_t>(window, st::Shape{1, static_cast<int64_t>(window.size())}).to(device);
    st::Tensor logits = model(x).select(1, -1).squeeze(0).to(st::kCPU).to(st::kFloat64);
    // temperature 0: the most likely token (top-1)
    int64_t next = o.temperature > 0 ? corpus::sample_top_k(corpus::to_vector(logits), o.temperature, o.top_k, g)
                                     : corpus::sample_top_k(corpus::to_vector(logits), 1.0, 1, g);
    tokens.push_back(next);
    if (next < 256) out.push_back(static_cast<char>(next));  // larger ids mark document ends
  }
  model.train();
  return out;
}

// One optimizer step on (x, y), moved to `device`; returns the loss. With --amp the forward runs
// under autocast (bfloat16 on the CPU, float16 on a GPU, where `scaler` is enabled); otherwise the
// autocast region is off and the disabled scaler passes everything through.
inline st::Tensor train_step(gpt::GPT& model, st::optim::Optimizer& opt, st::amp::GradScaler& scaler,
                             const st::Tensor& x, const st::Tensor& y, const Options& o, st::Device device) {
  st::Tensor loss;
  {
    st::amp::AutocastGuard autocast(device.type, device.is_cuda() ? st::kFloat16 : st::kBFloat16, o.amp);
    st::Tensor logits = model(x.to(device));
    loss = F::cross_entropy(logits.flatten(0, 1), y.to(device).flatten());
  }
  opt.zero_grad();
  scaler.scale(loss).backward();
  if (o.clip > 0) {
    scaler.unscale_(opt);  // clip the true gradients
    st::optim::clip_grad_norm_(model.parameters(), o.clip);
  }
  scaler.step(opt);
  scaler.update();
  return loss;
}

// --cuda-graphs (docs/cuda-graphs.md): the first kWarmup steps run eagerly on static device
// tensors (creating the optimizer's moments and the GEMM workspaces), the next is captured
// into a graph, and every step from there copies its batch into the static tensors and
// replays the graph. The loss tensor of the capture is rewritten by each replay.
struct GraphedStep {
  static constexpr int64_t kWarmup = 3;
  st::cuda::Graph graph;
  st::Tensor x, y, loss;  // static inputs, targets and loss
  int64_t eager_steps = 0;

  st::Tensor run(gpt::GPT& model, st::optim::Optimizer& opt, st::amp::GradScaler& scaler, const st::Tensor& bx,
                 const st::Tensor& by, const Options& o, st::Device device) {
    if (!x.defined()) {
      x = bx.to(device);
      y = by.to(device);
    } else {
      x.copy_(bx);
      y.copy_(by);
    }
    if (eager_steps < kWarmup) {
      ++eager_steps;
      return train_step(model, opt, scaler, x, y, o, device);
    }
    if (!graph.captured()) {
      st::cuda::GraphCapture capture(graph);
      loss = train_step(model, opt, scaler, x, y, o, device);
    }
    graph.replay();
    return loss;
  }
};

// Runs steps [start, end) and returns the last validation loss. `state` holds the model, the
// optimizer and `g`, the generator of training windows (Note [Exact resume]).
inline double train(const Options& o, gpt::GPT& model, st::optim::Optimizer& opt, st::amp::GradScaler& scaler,
                    const st::data::TokenWindowDataset& train_set, const st::data::TokenWindowDataset& val_set,
                    st::Generator& g, const st::io::TrainingState& state, int64_t start, st::Device device) {
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  // rows past the checkpoint would repeat: a resumed run trims them at its first row
  example::MetricsCsv csv(o.metrics, checkpointing::kMetricsHeader, start, "transformer");
  const double tokens_per_step = static_cast<double>(o.batch * o.model.context);
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  auto t0 = std::chrono::steady_clock::now();
  double running = 0, val_loss = NAN;
  double interval_seconds = 0, train_seconds = 0;  // training alone: validation and checkpoints excluded
  int64_t running_n = 0;
  profiling::StepProfiler profiler(o.profile, end - start, device);
  GraphedStep graphed;
  for (int64_t step = start; step < end; ++step) {
    auto before = std::chrono::steady_clock::now();
    double lr = lr_at(o, step);
    for (size_t i = 0; i < opt.num_param_groups(); ++i) opt.set_lr(i, lr);
    auto [x, y] = random_batch(train_set, o.batch, g);
    const double l = (o.cuda_graphs ? graphed.run(model, opt, scaler, x, y, o, device)
                                    : train_step(model, opt, scaler, x, y, o, device))
                         .item<double>();  // item() waits for the device
    const double step_seconds = seconds(before, std::chrono::steady_clock::now());
    profiler.step();
    interval_seconds += step_seconds;
    train_seconds += step_seconds;
    example::check_loss("transformer", l, step + 1);
    running += l;
    ++running_n;
    const bool log = (step + 1) % o.log_every == 0 || step + 1 == end;
    const bool eval = (step + 1) % o.eval_every == 0 || step + 1 == end;
    if (eval) val_loss = evaluate(model, val_set, o, device);
    auto now = std::chrono::steady_clock::now();
    csv.row() << step + 1 << ',' << fmt::format("{}", l) << ',' << fmt::format("{}", lr) << ','
              << fmt::format("{:.0f}", tokens_per_step / std::max(step_seconds, 1e-9)) << ','
              << (eval ? fmt::format("{}", val_loss) : "") << '\n';
    if (log || eval) {
      // the training rate of the steps since the last line
      double tps = tokens_per_step * static_cast<double>(running_n) / std::max(interval_seconds, 1e-9);
      double elapsed = seconds(t0, now);
      double eta = elapsed / static_cast<double>(step + 1 - start) * static_cast<double>(end - step - 1);
      std::printf("step %5lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %5.1fs  eta %5.1fs%s\n",
                  (long long)(step + 1), (long long)o.steps, running / running_n, lr, tps, elapsed, eta,
                  eval ? fmt::format("  val {:.4f}", val_loss).c_str() : "");
      std::fflush(stdout);
      running = 0;
      running_n = 0;
      interval_seconds = 0;
    }
    if (eval) {
      csv.flush();  // the CSV holds every row the checkpoint covers
      checkpointing::save(o.checkpoint, state, step + 1);
    }
  }
  profiler.stop();
  if (end > start)
    std::printf("training: %lld steps in %.1f s, %.0f tokens/s (validation and checkpoints excluded)\n",
                (long long)(end - start), train_seconds,
                tokens_per_step * static_cast<double>(end - start) / std::max(train_seconds, 1e-9));
  if (std::isnan(val_loss)) val_loss = evaluate(model, val_set, o, device);  // nothing left to run
  return val_loss;
}
