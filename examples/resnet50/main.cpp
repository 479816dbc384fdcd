// Trains ResNet-50 v1.5 (model.hpp) on an ImageFolder (root/<class>/<image>, ImageNet-style
// augmentation) or, by default, on synthetic ImageNet-shaped images, which measures the
// training step rather than the disk and the JPEG decoder. Batches come from a DataLoader with
// worker threads; SGD with momentum (optionally Nesterov) or LAMB runs under a linear warmup and
// cosine decay, with label smoothing. A progress line per interval shows step, loss, lr,
// images/s and elapsed time; --val-data adds validation loss and top-1/top-5 accuracy; a
// metrics CSV gets one row per step; the end prints the mean images/s after the first few
// steps. --checkpoint saves the whole run (model, optimizer, schedule, generator, loader
// position) every --checkpoint-every steps and at the end, and --resume continues one exactly
// (Note [Exact resume] in train_loop.hpp). --print-params-only builds the model, prints its
// parameter count and exits.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "../common/cli.hpp"
#include "../common/run_checks.hpp"
#include "model.hpp"
#include "train_loop.hpp"

namespace {

using namespace resnet;

void add_options(CLI::App& app, Options& o) {
  // a later --x overrides; --help shows each option's default
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  app.add_option("--data", o.data, "ImageFolder root (root/<class>/<image>); default: synthetic images");
  app.add_option("--val-data", o.val_data, "ImageFolder of validation images (the same classes as --data)");
  app.add_option("--eval-every", o.eval_every, "steps between validations (0: at the end only)")
      ->check(example::at_least(0));
  app.add_option("--synthetic-size", o.synthetic_size, "synthetic images per epoch")
      ->check(example::in_range(1, 100'000'000));
  app.add_option("--image-size", o.image_size, "training resolution (square)")->check(CLI::Range(32, 4096));
  app.add_option("--classes", o.classes, "classes of the synthetic data")->check(example::in_range(1, 100'000));
  app.add_option("--batch", o.batch, "images per step (at most the training set)");
  app.add_option("--steps", o.steps, "optimizer steps (the schedule spans them)")->check(example::at_least(1));
  app.add_option("--warmup", o.warmup, "linear warmup steps of the learning rate")->check(example::at_least(0));
  app.add_option("--optimizer", o.optimizer, "sgd | lamb")->check(CLI::IsMember({"sgd", "lamb"}));
  app.add_option("--lr", o.lr, "peak learning rate (0: 0.1 * batch / 256 for sgd, 5e-3 for lamb)");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine decay");
  app.add_option("--momentum", o.momentum, "SGD momentum, in [0, 1)");
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum (SGD)");
  app.add_option("--weight-decay", o.weight_decay, "weight decay (conv and linear weights only)");
  app.add_option("--label-smoothing", o.label_smoothing, "label smoothing of the loss, in [0, 1)");
  app.add_flag("--zero-init-residual", o.zero_init_residual, "start each block's last BatchNorm at gamma 0");
  app.add_flag("--channels-last", o.channels_last, "feed the network channels-last (NHWC) batches");
  app.add_flag("--cudnn-benchmark", o.cudnn_benchmark, "let cuDNN pick the fastest algorithms (GPU only)");
  app.add_flag("--amp", o.amp,
               "mixed precision: bfloat16 autocast on the CPU, float16 autocast with loss scaling on CUDA");
  app.add_option("--workers", o.workers, "DataLoader worker threads (0: load in the training thread)")
      ->check(example::at_least(0));
  app.add_option("--threads", o.threads, "CPU threads for the kernels (0: all, at most 1024)");
  app.add_option("--seed", o.seed, "random seed")->check(example::seed_value);
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--log-every", o.log_every, "steps between progress lines")->check(example::at_least(1));
  app.add_option("--timing-warmup", o.timing_warmup, "first steps left out of the final images/s")
      ->check(example::at_least(0));
  app.add_option("--metrics", o.metrics, "CSV file: one row per step");
  app.add_option("--checkpoint", o.checkpoint, "checkpoint file (default: none), written at the end of the run");
  app.add_option("--checkpoint-every", o.checkpoint_every, "also checkpoint every N steps (0: only at the end)")
      ->check(example::at_least(0));
  app.add_flag("--resume", o.resume, "continue the run saved in --checkpoint (same model and optimizer)");
  app.add_option("--stop-after", o.stop_after, "stop after this step, with a checkpoint (0: run all steps)")
      ->check(example::at_least(0));
  app.add_flag("--print-params-only", o.print_params_only, "build the model, print its parameter count, exit");
}

// Refuses bad options before anything is read or written, naming the option; `given` says
// whether an option was on the command line (some apply only with others).
void validate(const Options& o, const std::function<bool(const char*)>& given) {
  using example::require, example::finite_at_least;
  const char* who = "resnet50";
  STRATA_CHECK(o.data.empty() || !given("--classes"),
               "[resnet50] --classes sets the classes of synthetic data; an ImageFolder (--data) has one per folder");
  STRATA_CHECK(o.data.empty() || !given("--synthetic-size"), "[resnet50] --synthetic-size applies to synthetic data "
               "only, not to --data");
  STRATA_CHECK(!o.val_data.empty() || !given("--eval-every"), "[resnet50] --eval-every needs --val-data");
  STRATA_CHECK(o.optimizer == "sgd" || (!given("--momentum") && !given("--nesterov")),
               "[resnet50] --momentum and --nesterov apply to --optimizer sgd, not {}", o.optimizer);
  require(who, "--batch", o.batch, o.batch >= 1 && o.batch <= 65536, "in 1..65536");
  require(who, "--lr", o.lr, finite_at_least(o.lr, 0), "finite and >= 0 (0: the default)");
  require(who, "--min-lr", o.min_lr, finite_at_least(o.min_lr, 0) && o.min_lr <= o.lr, "finite, >= 0 and <= --lr");
  require(who, "--weight-decay", o.weight_decay, finite_at_least(o.weight_decay, 0), "finite and >= 0");
  require(who, "--momentum", o.momentum, o.momentum >= 0 && o.momentum < 1, "in [0, 1)");
  require(who, "--label-smoothing", o.label_smoothing, o.label_smoothing >= 0 && o.label_smoothing < 1, "in [0, 1)");
  STRATA_CHECK(o.warmup < o.steps, "[resnet50] --warmup ({}) must be less than --steps ({})", o.warmup, o.steps);
  STRATA_CHECK(!o.checkpoint.empty() || (!o.resume && o.stop_after == 0 && o.checkpoint_every == 0),
               "[resnet50] --resume, --stop-after and --checkpoint-every need --checkpoint PATH");
  std::vector<example::NamedPath> outputs{{"--metrics", o.metrics}};
  if (!o.checkpoint.empty()) outputs.emplace_back("--checkpoint", o.checkpoint);  // optional
  example::check_paths(who, {{"--data", o.data}, {"--val-data", o.val_data}}, outputs);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train ResNet-50 on an ImageFolder or on synthetic ImageNet-shaped data"};
  add_options(app, o);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);

  try {
    example::set_threads("resnet50", o.threads);
    st::manual_seed(o.seed);
    if (o.lr == 0) o.lr = o.optimizer == "lamb" ? 5e-3 : 0.1 * static_cast<double>(o.batch) / 256;
    validate(o, [&app](const char* option) { return app.count(option) > 0; });
    const st::Device device =
        o.device == "cuda" || (o.device == "auto" && st::cuda::is_available()) ? st::Device::cuda() : st::kCPU;
    if (device.type == st::DeviceType::CUDA) {
      st::cuda::set_benchmark_mode(o.cudnn_benchmark);  // cuDNN times its algorithms once per shape
    } else if (o.cudnn_benchmark) {
      std::printf("note: --cudnn-benchmark has no effect on %s; it matters only on a GPU\n",
                  fmt::format("{}", device).c_str());
    }

    TrainData data = make_data(o);
    if (o.print_params_only) {  // the model these options train: its classes come from the data
      ResNet50 model({.classes = data.classes});
      std::printf("parameters: %lld\n", (long long)model.num_parameters());
      return 0;
    }
    STRATA_CHECK(o.batch <= data.dataset->size(), "[resnet50] --batch ({}) is larger than the training set ({} images)",
                 o.batch, data.dataset->size());
    st::data::DataLoader<st::data::Example> loader(
        data.dataset, {.batch_size = o.batch,
                       .shuffle = true,
                       .drop_last = true,
                       .num_workers = o.workers,
                       .pin_memory = device.type == st::DeviceType::CUDA,  // copied to the GPU asynchronously
                       .seed = o.seed});
    std::printf("data: %lld images of %lldx%lld from %s, %lld classes, %lld batches of %lld per epoch\n",
                (long long)data.dataset->size(), (long long)o.image_size, (long long)o.image_size,
                o.data.empty() ? "synthetic data" : o.data.c_str(), (long long)data.classes, (long long)loader.size(),
                (long long)o.batch);

    std::shared_ptr<st::data::ImageFolder> val_data = make_val_data(o, data);
    std::unique_ptr<st::data::DataLoader<st::data::Example>> val_loader;
    if (val_data) {
      val_loader = std::make_unique<st::data::DataLoader<st::data::Example>>(
          val_data, st::data::LoaderOptions{.batch_size = o.batch, .num_workers = o.workers});
      std::printf("validation: %lld images from %s\n", (long long)val_data->size(), o.val_data.c_str());
    }

    ResNet50 model({.classes = data.classes, .zero_init_residual = o.zero_init_residual});
    model.to(device);
    if (o.channels_last) model.to(st::MemoryFormat::ChannelsLast);  // the conv weights too, as the batches
    std::printf("model: ResNet-50 v1.5, %lld parameters, on %s%s; %s, peak lr %g, %lld steps (%lld warmup)\n",
                (long long)model.num_parameters(), fmt::format("{}", device).c_str(),
                o.channels_last ? ", channels-last" : "", o.optimizer.c_str(), o.lr, (long long)o.steps,
                (long long)o.warmup);

    auto opt = make_optimizer(model, o);
    st::optim::WarmupDecayLR schedule(*opt, o.warmup, o.steps, o.min_lr, st::optim::WarmupDecayLR::Decay::Cosine);
    // float16 needs loss scaling; bfloat16 has float32's range and does without
    st::amp::GradScaler scaler({.enabled = o.amp && device.type == st::DeviceType::CUDA});
    st::io::TrainingState state{.model = &model, .optimizer = opt.get(), .scheduler = st::io::stateful(schedule),
                                .config = run_config(o, data)};
    if (scaler.is_enabled()) state.scaler = st::io::stateful(scaler);
    if (o.amp)
      std::printf("mixed precision: %s autocast%s\n", device.is_cuda() ? "float16" : "bfloat16",
                  scaler.is_enabled() ? " with loss scaling" : "");
    int64_t start = 0;
    if (o.resume) {
      const st::io::Checkpoint progress = example::resume(o.checkpoint, state, "resnet50");
      loader.load_state(st::data::LoaderState::from_map(progress.loader));
      start = progress.step;
    }
    const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
    if (start >= end) {
      std::printf("nothing to run: the checkpoint is at step %lld of %lld\n", (long long)start, (long long)end);
      return 0;
    }
    const double ips = train(o, model, *opt, schedule, scaler, data, loader, val_loader.get(), device, state, start);
    if (end - start > o.timing_warmup)
      std::printf("mean throughput %.2f images/s (after the first %lld steps)\n", ips, (long long)o.timing_warmup);
    else
      std::printf("mean throughput %.2f images/s (over all steps)\n", ips);
    if (end < o.steps)
      std::printf("stopped after step %lld of %lld; continue with --resume\n", (long long)end, (long long)o.steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
