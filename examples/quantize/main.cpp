// Quantizes an MLP trained on Fashion-MNIST (Debian's dataset-fashion-mnist, installed by
// scripts/setup.sh) three ways and compares them with the float32 model on the test set:
// dynamic int8 (quant::quantize_dynamic), int4 weight-only with group-wise scales, and
// quantization-aware training (prepare_qat, a short fine-tune, convert). Each variant is a fresh
// model loaded with the float weights, so all live at once and are timed side by side. The
// int8 model is saved as safetensors and reloaded into a fresh quantized model, which must
// give the same outputs. The run ends with a table of accuracy, state-dict bytes and samples/s.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "../common/cli.hpp"
#include "../common/run_checks.hpp"
#include "mlp.hpp"

namespace {

using namespace qex;
namespace quant = strata::quant;

struct Options {
  int64_t width = 512;  // hidden widths: width, width / 2
  int64_t epochs = 3;
  int64_t steps = 0;  // 0: epochs passes over the training set
  int64_t batch = 128;
  double lr = 1e-3;
  int64_t group_size = 64;
  bool int4_asymmetric = false;
  int64_t qat_steps = 300;
  double qat_lr = 1e-4;
  bool skip_qat = false;
  int64_t eval_batch = 256;
  int64_t rounds = 5;
  int threads = 0;
  uint64_t seed = 1;
  std::string data_dir = st::data::fashion_mnist_dir();
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  int64_t log_every = 200;
  std::string save = "quantize_int8.safetensors";
};

void add_options(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  app.add_option("--width", o.width, "width of the first hidden layer (the second has half)")
      ->check(example::in_range(2, 8192));
  app.add_option("--epochs", o.epochs, "passes over the training set (when --steps is 0)")
      ->check(example::in_range(1, 1000));
  app.add_option("--steps", o.steps, "training steps of the float model (0: --epochs passes)")
      ->check(example::in_range(0, 10'000'000));
  app.add_option("--batch", o.batch, "training batch size")->check(example::in_range(1, 60000));
  app.add_option("--lr", o.lr, "AdamW learning rate of the float training (> 0)");
  app.add_option("--group-size", o.group_size, "int4: elements of a weight row sharing a scale")
      ->check(CLI::IsMember({32, 64, 128}));
  app.add_flag("--int4-asymmetric", o.int4_asymmetric, "int4: codes [0, 15] with a zero point per group");
  app.add_option("--qat-steps", o.qat_steps, "fine-tuning steps with fake quantization")
      ->check(example::in_range(1, 10'000'000));
  app.add_option("--qat-lr", o.qat_lr, "AdamW learning rate of the QAT fine-tune (> 0)");
  app.add_flag("--skip-qat", o.skip_qat, "leave out quantization-aware training");
  app.add_option("--eval-batch", o.eval_batch, "test rows per forward, in accuracy and timing")
      ->check(example::in_range(1, 10000));
  app.add_option("--rounds", o.rounds, "timed passes over the test set per model (the median counts)")
      ->check(example::in_range(1, 1000));
  app.add_option("--threads", o.threads, "CPU threads for the kernels (0: all, at most 1024)");
  app.add_option("--seed", o.seed, "random seed")->check(example::seed_value);
  app.add_option("--data-dir", o.data_dir, "folder with Fashion-MNIST's four .gz IDX files");
  app.add_option("--limit-train", o.limit_train, "train on the first N images only (0: all)");
  app.add_option("--limit-test", o.limit_test, "test on the first N images only (0: all)");
  app.add_option("--log-every", o.log_every, "steps between loss lines")->check(example::at_least(1));
  app.add_option("--save", o.save, "the int8 model as safetensors, reloaded to check (empty: not saved)");
}

// Refuses bad options before anything is read or written, naming the option.
void validate(const Options& o) {
  using example::require;
  const char* who = "quantize";
  require(who, "--lr", o.lr, std::isfinite(o.lr) && o.lr > 0, "finite and > 0");
  require(who, "--qat-lr", o.qat_lr, std::isfinite(o.qat_lr) && o.qat_lr > 0, "finite and > 0");
  require(who, "--width", o.width, o.width % 2 == 0, "even (the second hidden layer has half)");
  require(who, "--limit-train", o.limit_train, o.limit_train >= 0, ">= 0 (0: all)");
  require(who, "--limit-test", o.limit_test, o.limit_test >= 0, ">= 0 (0: all)");
  check_data_dir(o.data_dir);
  if (o.save.empty()) return;
  std::vector<example::NamedPath> inputs;
  for (const char* file : fashion::kIdxFiles)
    inputs.emplace_back("--data-dir", (std::filesystem::path(o.data_dir) / file).string());
  example::check_paths(who, inputs, {{"--save", o.save}});
}

struct Row {
  std::string variant;
  nn::Module* model;
  double accuracy = 0;
  int64_t bytes = 0;
  double samples_per_s = 0;
};

// A fresh model holding the float model's weights (modules are not copyable).
std::unique_ptr<Mlp> copy_of(const Mlp& trained, int64_t width, st::Generator& g) {
  auto model = std::make_unique<Mlp>(width, &g);
  model->load_state_dict(trained.state_dict());
  return model;
}

// Saves the int8 model, loads the file into a fresh model quantized the same way and checks
// that it computes the same outputs, bit for bit.
void round_trip(const std::string& path, Mlp& int8, int64_t width, st::Generator& g,
                const std::vector<st::Tensor>& inputs) {
  st::io::save_safetensors(path, int8.state_dict());
  Mlp reloaded(width, &g);
  quant::quantize_dynamic(reloaded);
  reloaded.load_state_dict(st::io::load_safetensors(path).tensors);
  const double diff = st::abs(predict(reloaded, inputs) - predict(int8, inputs)).max().item<double>();
  STRATA_CHECK(diff == 0, "[quantize] the int8 model reloaded from {} differs from the saved one by {}", path, diff);
  std::printf("int8 round trip: saved %s (%lld bytes); the reloaded model gives the same outputs\n", path.c_str(),
              (long long)std::filesystem::file_size(path));
}

void print_table(const std::vector<Row>& rows) {
  const Row& base = rows.front();
  std::printf("\n%-16s %9s %10s %9s %10s %9s\n", "variant", "accuracy", "bytes", "size/f32", "samples/s", "speed/f32");
  for (const Row& r : rows)
    std::printf("%-16s %8.2f%% %10lld %9.3f %10.0f %9.2f\n", r.variant.c_str(), r.accuracy, (long long)r.bytes,
                double(r.bytes) / double(base.bytes), r.samples_per_s, r.samples_per_s / base.samples_per_s);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Quantize an MLP trained on Fashion-MNIST: dynamic int8, int4 weight-only and QAT"};
  add_options(app, o);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);

  try {
    validate(o);
    example::set_threads("quantize", o.threads);
    st::Generator g(o.seed);
    const Split train_set = load_split(true, o.data_dir, o.limit_train);
    const Split test_set = load_split(false, o.data_dir, o.limit_test);
    const std::vector<st::Tensor> test_batches = batches(test_set.x, o.eval_batch);
    const int64_t n_train = train_set.x.size(0);
    const int64_t steps = o.steps > 0 ? o.steps : o.epochs * (n_train / std::min(o.batch, n_train));
    std::printf("data: %lld training and %lld test images from %s\n", (long long)train_set.x.size(0),
                (long long)test_set.x.size(0), o.data_dir.c_str());

    Mlp model(o.width, &g);
    std::printf("model: %lld-%lld-%lld-%lld MLP (784 pixels zero-padded to %lld), %lld parameters; %lld steps\n",
                (long long)kFeatures, (long long)o.width, (long long)(o.width / 2), (long long)kClasses,
                (long long)kFeatures, (long long)model.num_parameters(), (long long)steps);
    train("float", model, train_set, {.steps = steps, .batch = o.batch, .lr = o.lr, .log_every = o.log_every}, g);

    std::vector<Row> rows{{"float32", &model}};
    auto int8 = copy_of(model, o.width, g);
    const int64_t layers = quant::quantize_dynamic(*int8);
    rows.push_back({"int8-dynamic", int8.get()});
    auto int4 = copy_of(model, o.width, g);
    quant::quantize_dynamic(*int4, {.dtype = quant::WeightDtype::Int4, .group_size = o.group_size,
                                    .symmetric = !o.int4_asymmetric});
    rows.push_back({fmt::format("int4-g{}{}", o.group_size, o.int4_asymmetric ? "-asym" : ""), int4.get()});
    std::printf("quantized: %lld Linear layers to int8 (dynamic) and to int4 (weight-only, groups of %lld, %s)\n",
                (long long)layers, (long long)o.group_size, o.int4_asymmetric ? "asymmetric" : "symmetric");

    std::unique_ptr<Mlp> qat;
    if (!o.skip_qat) {
      qat = copy_of(model, o.width, g);
      quant::prepare_qat(*qat);
      train("qat", *qat, train_set, {.steps = o.qat_steps, .batch = o.batch, .lr = o.qat_lr, .log_every = o.log_every},
            g);
      // observers record in eval mode too (as PyTorch's): freeze the qparams before the test set
      qat->apply([](nn::Module& m) {
        if (auto* fq = dynamic_cast<quant::FakeQuantize*>(&m)) fq->disable_observer();
      });
      std::printf("qat: fake-quantized accuracy %.2f%% before convert\n", accuracy(*qat, test_batches, test_set.y));
      qat->eval();
      quant::convert(*qat);
      rows.push_back({"qat-int8", qat.get()});
    }
    if (!o.save.empty()) round_trip(o.save, *int8, o.width, g, test_batches);

    std::vector<nn::Module*> models;
    for (Row& r : rows) {
      r.accuracy = accuracy(*r.model, test_batches, test_set.y);
      r.bytes = state_bytes(*r.model);
      models.push_back(r.model);
    }
    const std::vector<double> rates = throughput(models, test_batches, o.rounds);
    for (size_t i = 0; i < rows.size(); ++i) rows[i].samples_per_s = rates[i];
    print_table(rows);
    std::printf("(accuracy on %lld test images; samples/s: median of %lld timed passes, batches of %lld, "
                "%d thread(s))\n",
                (long long)test_set.x.size(0), (long long)o.rounds, (long long)o.eval_batch, st::get_num_threads());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
