// Trains the small ResNet-style CNN of model.hpp on Fashion-MNIST (Debian's
// dataset-fashion-mnist, installed by scripts/setup.sh) on the CPU: shuffled batches from a
// DataLoader with worker threads, SGD with Nesterov momentum (or AdamW) under a one-cycle
// learning-rate schedule, label smoothing and optional flip or shift augmentation. Each epoch
// prints the training loss, test loss, test accuracy, images/s and elapsed time and adds a
// row to a metrics CSV; the final weights are saved as safetensors.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>

#include "../common/checkpoints.hpp"
#include "../common/cli.hpp"
#include "../common/run_checks.hpp"
#include "model.hpp"
#include "train_loop.hpp"

namespace {

using namespace fashion;

void add_options(CLI::App& app, Options& o) {
  // a later --x overrides; --help shows each option's default
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  app.add_option("--width", o.width, "channels of the first stage (then 2x and 4x)")
      ->check(example::in_range(1, 1024));
  app.add_option("--epochs", o.epochs, "passes over the training set (the schedule spans them)")
      ->check(example::in_range(1, 100'000));
  app.add_option("--batch", o.batch, "images per step")->check(example::at_least(1));
  app.add_option("--lr", o.lr, "peak learning rate of the one-cycle schedule (> 0)");
  app.add_option("--weight-decay", o.weight_decay, "weight decay (conv and linear weights only)");
  app.add_option("--label-smoothing", o.label_smoothing, "label smoothing of the training loss, in [0, 1)");
  app.add_option("--optimizer", o.optimizer, "sgd (Nesterov momentum) | adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--augment", o.augment, "none | flip | crop (flip and shift by up to 2 pixels)")
      ->check(CLI::IsMember({"none", "flip", "crop"}));
  app.add_option("--workers", o.workers, "DataLoader worker threads (0: load in the training thread)");
  app.add_option("--threads", o.threads, "CPU threads for the kernels (0: all, at most 1024)");
  app.add_option("--seed", o.seed, "random seed")->check(example::seed_value);
  app.add_option("--data-dir", o.data_dir, "folder with Fashion-MNIST's four .gz IDX files");
  app.add_option("--limit-train", o.limit_train, "train on the first N images only (0: all)");
  app.add_option("--limit-test", o.limit_test, "test on the first N images only (0: all)");
  app.add_option("--log-every", o.log_every, "steps between progress lines")->check(example::at_least(1));
  app.add_option("--metrics", o.metrics, "CSV file: one row per epoch");
  app.add_option("--weights", o.weights, "final model weights, as safetensors");
}

// Refuses bad options before anything is read or written, naming the option.
void validate(const Options& o) {
  using example::require, example::finite_at_least;
  const char* who = "fashion_mnist";
  require(who, "--lr", o.lr, std::isfinite(o.lr) && o.lr > 0, "finite and > 0");
  require(who, "--weight-decay", o.weight_decay, finite_at_least(o.weight_decay, 0), "finite and >= 0");
  require(who, "--label-smoothing", o.label_smoothing, o.label_smoothing >= 0 && o.label_smoothing < 1, "in [0, 1)");
  require(who, "--limit-train", o.limit_train, o.limit_train >= 0, ">= 0 (0: all)");
  require(who, "--limit-test", o.limit_test, o.limit_test >= 0, ">= 0 (0: all)");
  require(who, "--workers", o.workers, o.workers >= 0, ">= 0");
  std::vector<example::NamedPath> inputs;
  for (const char* file : kIdxFiles) inputs.emplace_back("--data-dir", (std::filesystem::path(o.data_dir) / file).string());
  example::check_paths(who, inputs, {{"--weights", o.weights}, {"--metrics", o.metrics}});
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a small CNN on Fashion-MNIST"};
  add_options(app, o);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);

  try {
    validate(o);
    example::set_threads("fashion_mnist", o.threads);
    st::manual_seed(o.seed);
    for (const char* file : {"train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"})
      STRATA_CHECK(std::filesystem::exists(std::filesystem::path(o.data_dir) / file),
                   "[fashion_mnist] no {} in {} (run scripts/setup.sh to install dataset-fashion-mnist)", file,
                   o.data_dir);
    auto train_set = std::make_shared<FashionImages>(st::data::IdxDataset::fashion_mnist(true, o.data_dir),
                                                     o.limit_train, o.augment, o.seed);
    auto test_set = std::make_shared<FashionImages>(st::data::IdxDataset::fashion_mnist(false, o.data_dir),
                                                    o.limit_test, "none", o.seed);
    st::data::DataLoader<st::data::Example> train_loader(
        train_set, {.batch_size = o.batch, .shuffle = true, .num_workers = o.workers, .seed = o.seed});
    st::data::DataLoader<st::data::Example> test_loader(test_set, {.batch_size = 500, .num_workers = o.workers});
    std::printf("data: %lld training and %lld test images from %s; augmentation %s\n", (long long)train_set->size(),
                (long long)test_set->size(), o.data_dir.c_str(), o.augment.c_str());

    Net model(o.width);
    std::printf("model: channels %lld/%lld/%lld, %lld parameters; %s, peak lr %g, %lld epochs of %lld steps\n",
                (long long)o.width, (long long)(2 * o.width), (long long)(4 * o.width),
                (long long)model.num_parameters(), o.optimizer.c_str(), o.lr, (long long)o.epochs,
                (long long)train_loader.size());

    auto opt = make_optimizer(model, o);
    st::optim::OneCycleLR schedule(*opt, o.lr, o.epochs * train_loader.size(), {.pct_start = 0.25});

    example::MetricsCsv csv(o.metrics, "epoch,train_loss,test_loss,test_accuracy,images_per_s,elapsed_s", 0,
                            "fashion_mnist");
    const auto t0 = std::chrono::steady_clock::now();
    TestResult test;
    for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      const double train_loss = train_epoch(o, epoch, model, *opt, schedule, train_loader, t0);
      const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double ips = static_cast<double>(train_set->size()) / std::max(train_s, 1e-9);
      test = evaluate(model, test_loader);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("epoch %lld/%lld  train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.0f img/s  elapsed %.1fs\n",
                  (long long)epoch, (long long)o.epochs, train_loss, test.loss, 100 * test.accuracy, ips, elapsed);
      std::fflush(stdout);
      csv.row() << epoch << ',' << fmt::format("{}", train_loss) << ',' << fmt::format("{}", test.loss) << ','
          << fmt::format("{}", test.accuracy) << ',' << fmt::format("{:.1f}", ips) << ','
          << fmt::format("{:.1f}", elapsed) << '\n';
      csv.flush();
    }
    std::printf("final test accuracy %.2f%% on %lld images\n", 100 * test.accuracy, (long long)test_set->size());
    st::io::save_safetensors(o.weights, model.state_dict());
    std::printf("weights: saved to %s\n", o.weights.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
