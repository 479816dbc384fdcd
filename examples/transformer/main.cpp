// Trains the byte-level GPT of gpt.hpp on a text corpus (by default the English text of
// Debian's fortunes package), reports progress and validation loss, writes a metrics CSV,
// and prints a sample generated from the trained model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "corpus.hpp"
#include "gpt.hpp"

namespace st = strata;
namespace F = strata::nn::functional;

namespace {

struct Options {
  gpt::Config model;
  int64_t batch = 16;
  int64_t steps = 400;
  double lr = 3e-3;
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
  std::string corpus = "/usr/share/games/fortunes";
  std::string metrics = "transformer_metrics.csv";
  int64_t sample_tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 20;
  int threads = 0;
};

// Linear warmup to lr, then cosine decay to min_lr.
double lr_at(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  double progress = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + std::cos(M_PI * std::min(progress, 1.0)));
}

// Decay on matrices only (not on biases, norms), as is usual for Transformers.
template <class Opt, class Options>
std::unique_ptr<st::optim::Optimizer> grouped(gpt::GPT& model, Options decay) {
  Options no_decay = decay;
  no_decay.weight_decay = 0;
  std::vector<st::Tensor> matrices, others;
  for (const st::Tensor& p : model.parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
  return std::make_unique<Opt>(std::vector<typename Opt::Group>{{matrices, decay}, {others, no_decay}}, decay);
}

std::unique_ptr<st::optim::Optimizer> make_optimizer(gpt::GPT& model, const std::string& name, double lr,
                                                     double weight_decay) {
  if (name == "lamb") return grouped<st::optim::LAMB>(model, st::optim::LAMBOptions{.lr = lr, .weight_decay = weight_decay});
  if (name == "adam8bit")
    return grouped<st::optim::Adam8bit>(model, st::optim::Adam8bitOptions{.lr = lr, .weight_decay = weight_decay});
  return grouped<st::optim::AdamW>(model, st::optim::AdamWOptions{.lr = lr, .betas = {0.9, 0.95}, .weight_decay = weight_decay});
}

void set_lr(st::optim::Optimizer& opt, double lr) {
  for (size_t g = 0; g < opt.num_param_groups(); ++g) opt.set_lr(g, lr);
}

double evaluate(gpt::GPT& model, const corpus::Windows& data, const Options& o, st::Device device) {
  st::NoGradGuard no_grad;
  model.eval();
  st::Generator g(o.seed + 1);  // the same validation windows every time
  double total = 0;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    auto [x, y] = data.batch(o.batch, o.model.context, g);
    st::Tensor logits = model(x.to(device));
    total += F::cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item<double>();
  }
  model.train();
  return total / static_cast<double>(o.eval_batches);
}

std::string sample(gpt::GPT& model, const std::string& prompt, const Options& o, st::Device device) {
  st::NoGradGuard no_grad;
  model.eval();
  st::Generator g(o.seed + 2);
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  std::string out = prompt;
  for (int64_t i = 0; i < o.sample_tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - o.model.context);
    std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    st::Tensor x = st::from_vector<int64_t>(window, st::Shape{1, static_cast<int64_t>(window.size())}).to(device);
    st::Tensor logits = model(x).select(1, -1).squeeze(0).to(st::kCPU).to(st::kFloat64) / o.temperature;
    std::vector<double> l = corpus::to_vector(logits);
    int64_t next = corpus::sample_top_k(l, o.top_k, g);
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  model.train();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a byte-level GPT on a text corpus"};
  app.add_option("--layers", o.model.layers, "transformer blocks");
  app.add_option("--width", o.model.width, "embedding width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--context", o.model.context, "context length in bytes");
  app.add_option("--dropout", o.model.dropout, "dropout probability");
  app.add_option("--batch", o.batch, "sequences per step");
  app.add_option("--steps", o.steps, "optimizer steps");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--weight-decay", o.weight_decay, "decoupled weight decay (matrices only)");
  app.add_option("--clip", o.clip, "gradient norm clip (0: off)");
  app.add_option("--optimizer", o.optimizer, "adamw | lamb | adam8bit")->check(CLI::IsMember({"adamw", "lamb", "adam8bit"}));
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--log-every", o.log_every, "steps between progress lines");
  app.add_option("--eval-every", o.eval_every, "steps between validation runs");
  app.add_option("--eval-batches", o.eval_batches, "validation batches per run");
  app.add_option("--corpus", o.corpus, "a text file, or a folder of text files");
  app.add_option("--metrics", o.metrics, "CSV file for step, loss, lr, tokens/s, validation loss");
  app.add_option("--sample-tokens", o.sample_tokens, "bytes to generate at the end (0: none)");
  app.add_option("--temperature", o.temperature, "sampling temperature");
  app.add_option("--top-k", o.top_k, "sample among the k most likely bytes");
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.threads > 0) st::set_num_threads(o.threads);
    st::Device device = o.device == "cuda" || (o.device == "auto" && st::cuda::is_available()) ? st::Device::cuda()
                                                                                                : st::kCPU;
    st::manual_seed(o.seed);
    corpus::Text text = corpus::load(o.corpus);
    corpus::Windows train(text.bytes, 0, text.split), val(text.bytes, text.split, text.bytes.size());
    std::printf("corpus: %zu bytes from %zu files (train %zu, validation %zu); unigram entropy %.3f nats/byte\n",
                text.bytes.size(), text.files, text.split, text.bytes.size() - text.split,
                corpus::unigram_entropy(text.bytes, text.split));

    gpt::GPT model(o.model);
    model.to(device);
    std::printf("model: %lld layers, width %lld, %lld heads, context %lld, %lld parameters, on %s\n",
                (long long)o.model.layers, (long long)o.model.width, (long long)o.model.heads,
                (long long)o.model.context, (long long)model.num_parameters(), fmt::format("{}", device).c_str());

    auto opt = make_optimizer(model, o.optimizer, o.lr, o.weight_decay);
    std::ofstream csv(o.metrics);
    csv << "step,loss,lr,tokens_per_s,val_loss\n";
    st::Generator g(o.seed);
    const double tokens_per_step = static_cast<double>(o.batch * o.model.context);
    auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    double running = 0;
    int64_t running_n = 0;
    for (int64_t step = 0; step < o.steps; ++step) {
      double lr = lr_at(o, step);
      set_lr(*opt, lr);
      auto [x, y] = train.batch(o.batch, o.model.context, g);
      st::Tensor logits = model(x.to(device));
      st::Tensor loss = F::cross_entropy(logits.flatten(0, 1), y.to(device).flatten());
      opt->zero_grad();
      loss.backward();
      if (o.clip > 0) st::optim::clip_grad_norm_(model.parameters(), o.clip);
      opt->step();
      running += loss.item<double>();
      ++running_n;
      bool log = (step + 1) % o.log_every == 0 || step + 1 == o.steps;
      bool eval = (step + 1) % o.eval_every == 0 || step + 1 == o.steps;
      double val_loss = eval ? evaluate(model, val, o, device) : NAN;
      if (log || eval) {
        auto now = std::chrono::steady_clock::now();
        double elapsed = std::chrono::duration<double>(now - t0).count();
        double interval = std::chrono::duration<double>(now - last).count();
        double tps = tokens_per_step * static_cast<double>(running_n) / std::max(interval, 1e-9);
        double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(o.steps - step - 1);
        std::printf("step %5lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %5.1fs  eta %5.1fs%s\n",
                    (long long)(step + 1), (long long)o.steps, running / running_n, lr, tps, elapsed, eta,
                    eval ? fmt::format("  val {:.4f}", val_loss).c_str() : "");
        std::fflush(stdout);
        csv << step + 1 << ',' << running / running_n << ',' << lr << ',' << tps << ','
            << (eval ? fmt::format("{}", val_loss) : "") << '\n';
        running = 0;
        running_n = 0;
        last = now;
      }
    }
    double final_val = evaluate(model, val, o, device);
    std::printf("final validation loss %.4f nats/byte (unigram baseline %.4f)\n", final_val,
                corpus::unigram_entropy(text.bytes, text.split));
    if (o.sample_tokens > 0) std::printf("--- sample ---\n%s\n--------------\n", sample(model, "Q: ", o, device).c_str());
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
