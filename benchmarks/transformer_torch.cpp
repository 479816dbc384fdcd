// The LibTorch twin of examples/transformer, for side-by-side validation losses and times:
// the same byte-level GPT (gpt_torch.hpp: same layers, width, heads, context, tied embedding)
// trained on the same token shards with the same batch, steps, AdamW groups and
// hyperparameters, warmup + cosine schedule, gradient clipping and validation protocol, and
// the same option names and defaults. It links no strata: the shards are read with
// token_shard_file.h, and strata's random streams are replayed (strata_stream_replay.h), so
// both programs see the same training windows in the same order, the same validation windows,
// and by default (--init strata) start from the same weights. Progress lines, the metrics CSV
// and the final validation line have the example's format; checkpoints, the saved weights and
// the generated sample are left out (their time is not part of the comparison).
// Compiled as C++17: LibTorch 1.13's headers predate C++20.
#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>

#include "examples/common/cli.hpp"  // decimal integer options, as the example reads them

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpt_torch.hpp"
#include "strata_stream_replay.h"
#include "token_shard_file.h"

namespace {

using bench::Gpt;
using bench::PhiloxReplay;
using Clock = std::chrono::steady_clock;

// The example's options that shape training (examples/transformer/train_loop.hpp), same defaults.
struct Options {
  bench::GptConfig model;
  int64_t batch = 16;
  int64_t steps = 800;
  double lr = 2e-3;
  double min_lr = 3e-4;
  int64_t warmup = 50;
  double weight_decay = 0.1;
  double clip = 1.0;
  uint64_t seed = 1337;
  int64_t log_every = 50;
  int64_t eval_every = 200;
  int64_t eval_batches = 20;
  std::string train_data = "data/fortunes-train.bin";
  std::string val_data = "data/fortunes-val.bin";
  std::string metrics = "transformer_torch_metrics.csv";
  std::string init = "strata";
  int threads = 0;
};

void add_options(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--layers", o.model.layers, "transformer blocks");
  app.add_option("--width", o.model.width, "embedding width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--context", o.model.context, "context length in tokens");
  app.add_option("--dropout", o.model.dropout, "dropout probability (attention weights)");
  app.add_option("--batch", o.batch, "sequences per step");
  app.add_option("--steps", o.steps, "optimizer steps (the learning-rate schedule spans them)");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--weight-decay", o.weight_decay, "decoupled weight decay (matrices only)");
  app.add_option("--clip", o.clip, "gradient norm clip (0: off)");
  app.add_option("--seed", o.seed, "random seed (data windows and initial weights)");
  app.add_option("--log-every", o.log_every, "steps between progress lines")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", o.eval_every, "steps between validation runs")->check(CLI::PositiveNumber);
  app.add_option("--eval-batches", o.eval_batches, "validation batches per run")->check(CLI::PositiveNumber);
  app.add_option("--train-data", o.train_data, "token shard of training text (strata-tokenize)");
  app.add_option("--val-data", o.val_data, "token shard of validation text");
  app.add_option("--metrics", o.metrics, "CSV file: step, loss, lr, tokens/s, validation loss");
  app.add_option("--init", o.init, "strata: the example's initial weights (its random stream replayed); "
                                   "torch: the same distributions from LibTorch's generator")
      ->check(CLI::IsMember({"strata", "torch"}));
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
}

// Linear warmup to lr, then cosine decay to min_lr (the example's lr_at).
double lr_at(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  double progress = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + std::cos(M_PI * std::min(progress, 1.0)));
}

// The shortest text that reads back as `v`, as the example's fmt::format("{}", v).
std::string shortest(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void fill_from(torch::Tensor p, std::vector<float> values) {
  p.copy_(torch::from_blob(values.data(), p.sizes(), torch::kFloat));
}

// The initial weights of the strata example for seed `seed` (examples/transformer/gpt.hpp): it
// seeds strata's default generator, and the GPT's constructor draws, in member order, the
// embeddings from N(0, 1) and each block's Linear weight then bias from U(-1/sqrt(in),
// 1/sqrt(in)) (LayerNorms draw nothing); then the GPT-2 pass redraws every matrix, in
// parameter order, from N(0, 0.02), residual projections from N(0, 0.02 / sqrt(2 * layers)).
void strata_initialisation(Gpt& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  PhiloxReplay g(seed);
  for (auto* emb : {&model->wte, &model->wpe}) fill_from((*emb)->weight, g.normal((*emb)->weight.numel(), 0.0, 1.0));
  for (const auto& b : *model->h) {
    auto* block = b->as<bench::GptBlock>();
    for (auto* lin : {&block->c_attn, &block->c_proj, &block->mlp_fc, &block->mlp_proj}) {
      const double bound = 1.0 / std::sqrt(static_cast<double>((*lin)->options.in_features()));
      fill_from((*lin)->weight, g.uniform((*lin)->weight.numel(), -bound, bound));
      fill_from((*lin)->bias, g.uniform((*lin)->bias.numel(), -bound, bound));
    }
  }
  for (auto& p : model->named_parameters()) {
    if (p.value().dim() < 2) continue;
    double std = 0.02;
    if (bench::GptImpl::is_residual_projection(p.key())) std /= std::sqrt(2.0 * static_cast<double>(model->config.layers));
    fill_from(p.value(), g.normal(p.value().numel(), 0.0, std));
  }
}

// Decay on matrices only (not on biases, norms), as the example's optimizer groups.
torch::optim::AdamW make_optimizer(Gpt& model, const Options& o) {
  std::vector<torch::Tensor> matrices, others;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
  torch::optim::AdamWOptions decay(o.lr);
  decay.betas(std::make_tuple(0.9, 0.95)).weight_decay(o.weight_decay);  // eps 1e-8 in both libraries
  torch::optim::AdamWOptions no_decay = decay;
  no_decay.weight_decay(0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(decay));
  groups.emplace_back(others, std::make_unique<torch::optim::AdamWOptions>(no_decay));
  return torch::optim::AdamW(std::move(groups), decay);
}

// `batch` windows of `context` tokens at starts drawn as the example's random_window draws
// them: (input, target), each (batch, context) int64.
std::pair<torch::Tensor, torch::Tensor> random_batch(const std::vector<int64_t>& tokens, int64_t context, int64_t batch,
                                                     PhiloxReplay& g) {
  torch::Tensor x = torch::empty({batch, context}, torch::kLong), y = torch::empty({batch, context}, torch::kLong);
  const int64_t starts = static_cast<int64_t>(tokens.size()) - context;  // > 0, checked in main
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t s = g.window_start(starts);
    std::memcpy(x.data_ptr<int64_t>() + i * context, tokens.data() + s, context * sizeof(int64_t));
    std::memcpy(y.data_ptr<int64_t>() + i * context, tokens.data() + s + 1, context * sizeof(int64_t));
  }
  return {x, y};
}

double evaluate(Gpt& model, const std::vector<int64_t>& val, const Options& o) {
  torch::NoGradGuard no_grad;
  model->eval();
  PhiloxReplay g(o.seed + 1);  // the example's validation windows, the same every time
  double total = 0;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    auto [x, y] = random_batch(val, o.model.context, o.batch, g);
    torch::Tensor logits = model->forward(x);
    total += torch::nn::functional::cross_entropy(logits.flatten(0, 1), y.flatten()).item<double>();
  }
  model->train();
  return total / static_cast<double>(o.eval_batches);
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  const auto process_start = Clock::now();
  Options o;
  CLI::App app{"Train the Transformer example's byte-level GPT with LibTorch"};
  add_options(app, o);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);

  try {
    at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    const std::vector<int64_t> train = bench::read_token_shard(o.train_data), val = bench::read_token_shard(o.val_data);
    for (const auto* s : {&train, &val})
      TORCH_CHECK(static_cast<int64_t>(s->size()) > o.model.context, "[transformer_torch] a shard of ", s->size(),
                  " tokens holds no window of ", o.model.context + 1, " tokens");
    o.model.vocab = bench::shard_vocab_size(train, val);
    const double baseline = bench::unigram_entropy(train, val, o.model.vocab);
    std::printf("data: %lld training and %lld validation tokens, vocabulary %lld; unigram entropy %.3f nats/token\n",
                (long long)train.size(), (long long)val.size(), (long long)o.model.vocab, baseline);

    torch::manual_seed(o.seed);
    Gpt model(o.model);
    if (o.init == "strata") strata_initialisation(model, o.seed);
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    std::printf("model: %lld layers, width %lld, %lld heads, context %lld, %lld parameters, on cpu "
                "(LibTorch %d.%d, %d threads, %s initial weights)\n",
                (long long)o.model.layers, (long long)o.model.width, (long long)o.model.heads,
                (long long)o.model.context, (long long)params, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                at::get_num_threads(), o.init == "strata" ? "strata's" : "LibTorch's");

    torch::optim::AdamW opt = make_optimizer(model, o);
    PhiloxReplay data_gen(o.seed);  // training windows
    std::ofstream csv(o.metrics);
    csv << "step,loss,lr,tokens_per_s,val_loss\n";
    TORCH_CHECK(csv.good(), "[transformer_torch] cannot write the metrics file ", o.metrics);

    const double tokens_per_step = static_cast<double>(o.batch * o.model.context);
    const auto t0 = Clock::now();
    double running = 0, val_loss = NAN, train_seconds = 0, eval_seconds = 0, interval_seconds = 0;
    int64_t running_n = 0, evals = 0;
    std::vector<double> step_seconds;  // training alone, for the median rate
    for (int64_t step = 0; step < o.steps; ++step) {
      const auto before = Clock::now();
      const double lr = lr_at(o, step);
      for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      auto [x, y] = random_batch(train, o.model.context, o.batch, data_gen);
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x).flatten(0, 1), y.flatten());
      for (auto& p : model->parameters()) p.mutable_grad().reset();  // zero_grad, set to none as strata's
      loss.backward();
      if (o.clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), o.clip);
      opt.step();
      const double l = loss.item<double>();
      const auto trained = Clock::now();
      train_seconds += seconds(before, trained);
      interval_seconds += seconds(before, trained);
      step_seconds.push_back(seconds(before, trained));
      running += l;
      ++running_n;
      const bool log = (step + 1) % o.log_every == 0 || step + 1 == o.steps;
      const bool eval = (step + 1) % o.eval_every == 0 || step + 1 == o.steps;
      if (eval) {
        val_loss = evaluate(model, val, o);
        ++evals;
      }
      const auto now = Clock::now();
      eval_seconds += seconds(trained, now);
      // as the example: the CSV has each step's training rate, a progress line the rate of the
      // steps since the last one, validation excluded from both
      const double step_tps = tokens_per_step / std::max(seconds(before, trained), 1e-9);
      csv << step + 1 << ',' << shortest(l) << ',' << shortest(lr) << ',' << std::llround(step_tps) << ','
          << (eval ? shortest(val_loss) : "") << '\n';
      if (log || eval) {
        const double tps = tokens_per_step * static_cast<double>(running_n) / std::max(interval_seconds, 1e-9);
        const double elapsed = seconds(t0, now);
        const double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(o.steps - step - 1);
        char val_text[32] = "";
        if (eval) std::snprintf(val_text, sizeof val_text, "  val %.4f", val_loss);
        std::printf("step %5lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %5.1fs  eta %5.1fs%s\n",
                    (long long)(step + 1), (long long)o.steps, running / running_n, lr, tps, elapsed, eta, val_text);
        std::fflush(stdout);
        running = 0;
        running_n = 0;
        interval_seconds = 0;
      }
    }
    if (std::isnan(val_loss)) val_loss = evaluate(model, val, o);  // no steps to run
    std::printf("final validation loss %.4f nats/token (unigram baseline %.4f)\n", val_loss, baseline);
    // the median step shows the rate of an unloaded machine when other processes took the
    // cores for part of the run; the mean includes those stretches
    double median_step = 0;
    if (!step_seconds.empty()) {
      std::nth_element(step_seconds.begin(), step_seconds.begin() + step_seconds.size() / 2, step_seconds.end());
      median_step = step_seconds[step_seconds.size() / 2];
    }
    std::printf("training: %lld steps in %.1f s, %.0f tokens/s (median step %.0f tokens/s), validation excluded; "
                "%lld validations in %.1f s; wall time %.1f s\n",
                (long long)o.steps, train_seconds, tokens_per_step * static_cast<double>(o.steps) / std::max(train_seconds, 1e-9),
                tokens_per_step / std::max(median_step, 1e-9), (long long)evals, eval_seconds,
                seconds(process_start, Clock::now()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
