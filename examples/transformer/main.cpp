// Trains the byte-level GPT of gpt.hpp on token shards written by strata-tokenize (by default
// the English text of Debian's fortunes package; scripts/run-main.sh tokenizes it on first
// run), reports progress and validation loss, writes a metrics CSV with one row per step,
// checkpoints at each validation (--resume continues exactly where a run stopped), saves the
// final weights as model.safetensors and prints a sample generated from the trained model.
#include <cmath>
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "../common/cli.hpp"
#include "../common/run_checks.hpp"
#include "checkpointing.hpp"
#include "corpus.hpp"
#include "gpt.hpp"
#include "train_loop.hpp"

namespace {

void add_options(CLI::App& app, Options& o) {
  // a later --x overrides; --help shows each option's default
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  app.add_option("--layers", o.model.layers, "transformer blocks");
  app.add_option("--width", o.model.width, "embedding width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--context", o.model.context, "context length in tokens");
  app.add_option("--dropout", o.model.dropout, "dropout probability");
  app.add_option("--batch", o.batch, "sequences per step");
  app.add_option("--steps", o.steps, "optimizer steps (the learning-rate schedule spans them)");
  app.add_option("--stop-after", o.stop_after, "stop after this step, with a checkpoint (0: run all steps)");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--weight-decay", o.weight_decay, "decoupled weight decay (matrices only)");
  app.add_option("--clip", o.clip, "gradient norm clip (0: off)");
  app.add_option("--optimizer", o.optimizer, "adamw | lamb | adam8bit")->check(CLI::IsMember({"adamw", "lamb", "adam8bit"}));
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--seed", o.seed, "random seed")->check(example::seed_value);
  app.add_option("--log-every", o.log_every, "steps between progress lines")->check(example::at_least(1));
  app.add_option("--eval-every", o.eval_every, "steps between validation runs and checkpoints")
      ->check(example::at_least(1));
  app.add_option("--eval-batches", o.eval_batches, "validation batches per run")->check(example::at_least(1));
  app.add_option("--train-data", o.train_data, "token shard of training text (strata-tokenize)");
  app.add_option("--val-data", o.val_data, "token shard of validation text");
  app.add_option("--checkpoint", o.checkpoint, "checkpoint file, written at each validation and at the end");
  app.add_flag("--resume", o.resume, "continue from --checkpoint (same model settings)");
  app.add_flag("--amp", o.amp,
               "mixed precision: bfloat16 autocast on the CPU, float16 autocast with loss scaling on CUDA");
  app.add_option("--weights", o.weights, "final model weights alone, as safetensors");
  app.add_option("--metrics", o.metrics, "CSV file: step, loss, lr, tokens/s, validation loss");
  app.add_option("--sample-tokens", o.sample_tokens, "tokens to generate at the end (0: none)");
  app.add_option("--temperature", o.temperature, "sampling temperature (0: always the most likely token)");
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (1 to the vocabulary size)");
  app.add_option("--threads", o.threads, "CPU threads (0: all, at most 1024)");
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "replay each training step as one CUDA graph (GPU only; AdamW, no --amp, --clip 0)");
  app.add_option("--profile", o.profile,
                 "profile a few steps after warm-up: write their Chrome trace to this file and print the op table");
}

// Refuses a model of more than 1e9 parameters (4 GB of fp32 weights, three times that with the
// optimizer's state): 12 * width^2 per block, and the embeddings once the vocabulary is known.
void check_size(const gpt::Config& m) {
  const double w = static_cast<double>(m.width);
  const double params = 12 * static_cast<double>(m.layers) * w * w + static_cast<double>(m.vocab + m.context) * w;
  example::require("transformer", "the model (--layers, --width)", fmt::format("about {:.3g} parameters", params),
                   params <= 1e9, "at most 1e9 parameters");
}

// Refuses bad options before anything is read or written, naming the option. The bounds keep
// batch * context and the parameter count far from overflow and from exhausting memory.
void validate(const Options& o) {
  using example::require, example::finite_at_least;
  const char* who = "transformer";
  const gpt::Config& m = o.model;
  require(who, "--layers", m.layers, m.layers >= 1 && m.layers <= 1024, "in 1..1024");
  require(who, "--width", m.width, m.width >= 1 && m.width <= 65536, "in 1..65536");
  require(who, "--heads", m.heads, m.heads >= 1 && m.heads <= m.width && m.width % m.heads == 0,
          "at least 1 and divide --width");
  require(who, "--context", m.context, m.context >= 1 && m.context <= 65536, "in 1..65536");
  require(who, "--batch", o.batch, o.batch >= 1 && o.batch <= 65536, "in 1..65536");
  require(who, "--batch * --context", o.batch * m.context, o.batch * m.context <= (int64_t{1} << 24),
          "at most 16777216 tokens per step");
  check_size(o.model);
  require(who, "--dropout", m.dropout, m.dropout >= 0 && m.dropout < 1, "in [0, 1)");
  require(who, "--steps", o.steps, o.steps >= 1, "at least 1");
  require(who, "--warmup", o.warmup, o.warmup >= 0 && o.warmup < o.steps, "in 0..steps-1");
  require(who, "--stop-after", o.stop_after, o.stop_after >= 0, ">= 0 (0: run all steps)");
  require(who, "--lr", o.lr, std::isfinite(o.lr) && o.lr > 0, "finite and > 0");
  require(who, "--min-lr", o.min_lr, finite_at_least(o.min_lr, 0) && o.min_lr <= o.lr, "finite, >= 0 and <= --lr");
  require(who, "--weight-decay", o.weight_decay, finite_at_least(o.weight_decay, 0), "finite and >= 0");
  require(who, "--clip", o.clip, finite_at_least(o.clip, 0), "finite and >= 0 (0: off)");
  require(who, "--sample-tokens", o.sample_tokens, o.sample_tokens >= 0 && o.sample_tokens <= 1'000'000,
          "in 0..1000000");
  require(who, "--temperature", o.temperature, finite_at_least(o.temperature, 0), "finite and >= 0 (0: greedy)");
  require(who, "--top-k", o.top_k, o.top_k >= 1, "at least 1");
  std::vector<example::NamedPath> outputs = {
      {"--checkpoint", o.checkpoint}, {"--weights", o.weights}, {"--metrics", o.metrics}};
  if (!o.profile.empty()) outputs.push_back({"--profile", o.profile});
  example::check_paths(who, {{"--train-data", o.train_data}, {"--val-data", o.val_data}}, outputs);
}


// --device auto: the GPU when there is one and this build of strata can train there. A tiny
// model of the same kind takes one step of the real loop on the GPU (forward, loss, backward,
// clipping, the chosen optimizer), a no-grad forward and a copy of its weights back; if any
// of it raises (an op without a CUDA kernel, say), the example says so and uses the CPU. It
// runs before the seed is set, so the run itself is the same either way.
bool gpu_can_train(const Options& o) {
  if (!st::cuda::is_available()) return false;
  try {
    const st::Device gpu = st::Device::cuda();
    Options tiny = o;
    tiny.model.layers = 1, tiny.model.width = 16, tiny.model.heads = 2, tiny.model.context = 8;
    gpt::GPT model(tiny.model);
    model.to(gpu);
    auto opt = make_optimizer(model, tiny);
    st::Generator g(1);
    st::Tensor x = st::randint(0, tiny.model.vocab, {2, tiny.model.context}, st::TensorOptions(st::kInt64), &g);
    st::amp::GradScaler scaler({.enabled = o.amp});
    train_step(model, *opt, scaler, x, x, tiny, gpu).item<double>();
    st::NoGradGuard no_grad;
    model(x.to(gpu)).sum().item<double>();
    for (const auto& [name, t] : model.state_dict()) t.to(st::kCPU);
    return true;
  } catch (const st::Error& e) {
    std::printf("a GPU is present but cannot train here (%s): training on the CPU\n", e.what());
    return false;
  }
}

// --cuda-graphs replays one captured step: only on a GPU, and only with what a graph can hold
// (docs/cuda-graphs.md): AdamW (LAMB and Adam8bit keep their step count on the host), no loss
// scaling or clipping (both read values back to the host). Dropout is redrawn per replay.
void check_cuda_graphs(const Options& o, st::Device device) {
  if (!o.cuda_graphs) return;
  STRATA_CHECK(device.is_cuda(), "[transformer] --cuda-graphs needs a GPU (CUDA graphs replay GPU work), but this run "
               "trains on the CPU");
  STRATA_CHECK(o.optimizer == "adamw", "[transformer] --cuda-graphs needs --optimizer adamw, got {}", o.optimizer);
  STRATA_CHECK(!o.amp, "[transformer] --cuda-graphs cannot be combined with --amp (loss scaling checks for "
               "overflow on the host)");
  STRATA_CHECK(o.clip == 0, "[transformer] --cuda-graphs needs --clip 0 (clipping reads the gradient norm back to "
               "the host), got {}", o.clip);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a byte-level GPT on token shards"};
  add_options(app, o);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);

  try {
    validate(o);
    example::set_threads("transformer", o.threads);
    st::Device device = o.device == "cuda" || (o.device == "auto" && gpu_can_train(o)) ? st::Device::cuda() : st::kCPU;
    check_cuda_graphs(o, device);
    st::manual_seed(o.seed);
    for (const auto& path : {o.train_data, o.val_data})
      STRATA_CHECK(std::filesystem::exists(path), "[transformer] no token shard at {} (write one with strata-tokenize)",
                   path);
    auto train_shard = std::make_shared<const st::data::TokenShard>(o.train_data);
    auto val_shard = std::make_shared<const st::data::TokenShard>(o.val_data);
    o.model.vocab = corpus::vocab_size(*train_shard, *val_shard);
    check_size(o.model);
    example::require("transformer", "--top-k", o.top_k, o.top_k <= o.model.vocab,
                     fmt::format("at most the vocabulary size {}", o.model.vocab).c_str());
    const double baseline = corpus::unigram_entropy(*train_shard, *val_shard, o.model.vocab);
    st::data::TokenWindowDataset train_set({train_shard}, o.model.context), val_set({val_shard}, o.model.context);
    std::printf("data: %lld training and %lld validation tokens, vocabulary %lld; unigram entropy %.3f nats/token\n",
                (long long)train_shard->size(), (long long)val_shard->size(), (long long)o.model.vocab, baseline);

    gpt::GPT model(o.model);
    model.to(device);
    std::printf("model: %lld layers, width %lld, %lld heads, context %lld, %lld parameters, on %s\n",
                (long long)o.model.layers, (long long)o.model.width, (long long)o.model.heads,
                (long long)o.model.context, (long long)model.num_parameters(), fmt::format("{}", device).c_str());

    auto opt = make_optimizer(model, o);
    st::Generator data_gen(o.seed);  // training windows
    st::io::TrainingState state{.model = &model, .optimizer = opt.get(), .generators = {{"data", &data_gen}},
                                .config = checkpointing::run_config(
                                    o.model, {.batch = o.batch, .steps = o.steps, .warmup = o.warmup,
                                              .eval_batches = o.eval_batches, .lr = o.lr, .min_lr = o.min_lr,
                                              .weight_decay = o.weight_decay, .clip = o.clip, .seed = o.seed})};
    // float16 needs loss scaling; bfloat16 has float32's range and does without
    st::amp::GradScaler scaler({.enabled = o.amp && device.is_cuda()});
    if (scaler.is_enabled()) state.scaler = st::io::stateful(scaler);
    if (o.amp) {
      state.config["amp"] = "yes";  // only then, so checkpoints of full-precision runs keep their keys
      std::printf("mixed precision: %s autocast%s\n", device.is_cuda() ? "float16" : "bfloat16",
                  scaler.is_enabled() ? " with loss scaling" : "");
    }
    const int64_t start = o.resume ? checkpointing::resume(o.checkpoint, state) : 0;
    const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
    if (start >= end) {
      std::printf("nothing to run: the checkpoint is at step %lld of %lld\n", (long long)start, (long long)end);
      return 0;
    }

    double val_loss = train(o, model, *opt, scaler, train_set, val_set, data_gen, state, start, device);
    std::printf("final validation loss %.4f nats/token (unigram baseline %.4f)\n", val_loss, baseline);
    st::io::save_safetensors(o.weights, model.state_dict());
    std::printf("weights: saved to %s\n", o.weights.c_str());
    if (o.stop_after > 0 && o.stop_after < o.steps) {
      std::printf("stopped after step %lld of %lld; continue with --resume\n", (long long)o.stop_after,
                  (long long)o.steps);
    } else if (o.sample_tokens > 0) {
      std::printf("--- sample ---\n%s\n--------------\n", sample(model, "Q: ", o, device).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
