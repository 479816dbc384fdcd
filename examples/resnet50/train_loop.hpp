// The example's options, data, optimizer and training loop: ImageNet-style augmentation of an
// ImageFolder (or synthetic images of the same shape), SGD with momentum or LAMB under a linear
// warmup and cosine decay, label smoothing, a metrics CSV with one row per step, validation
// (loss, top-1 and top-5 accuracy) on a second ImageFolder, and checkpoints that a later run
// continues exactly (--checkpoint, --resume).
//
// Note [Exact resume]: a checkpoint holds the model (with BatchNorm's running statistics), the
// optimizer, the grad scaler (--amp on a GPU), the schedule, the default generator and the
// loader's position (epoch and batches delivered); the images are a function of (seed, index,
// epoch), so a resumed run sees the batches the uninterrupted one would have and, on the CPU with
// the same thread count, logs the same losses.
//
// Throughput: the first `timing_warmup` steps are left out of the final images/s, as they
// include one-off costs (allocator growth, worker start-up, first-touch of the weights).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../common/checkpoints.hpp"
#include "../common/run_checks.hpp"
#include "model.hpp"

namespace resnet {

namespace F = strata::nn::functional;

struct Options {
  std::string data;      // ImageFolder root; empty: synthetic images
  std::string val_data;  // ImageFolder root of validation images, the same classes; empty: none
  int64_t eval_every = 0;  // steps between validations (0: at the end only)
  int64_t synthetic_size = 256;
  int64_t image_size = 224;
  int64_t classes = 1000;  // synthetic data only; an ImageFolder has one class per folder
  int64_t batch = 8;
  int64_t steps = 50;
  int64_t warmup = 5;  // linear warmup steps of the schedule
  std::string optimizer = "sgd";
  double lr = 0;  // 0: 0.1 * batch / 256 for SGD (Goyal et al.'s linear scaling), 5e-3 for LAMB
  double min_lr = 0;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-4;  // conv and linear weights only
  double label_smoothing = 0.1;
  bool zero_init_residual = false;
  bool channels_last = false;
  bool cudnn_benchmark = false;
  bool amp = false;
  int64_t workers = 2;
  int threads = 0;
  uint64_t seed = 1;
  std::string device = "auto";
  int64_t log_every = 10;
  int64_t timing_warmup = 2;
  std::string metrics = "resnet50_metrics.csv";
  std::string checkpoint;        // empty: no checkpoints
  int64_t checkpoint_every = 0;  // 0: at the end only
  bool resume = false;
  int64_t stop_after = 0;  // stop (with a checkpoint) after this step; the schedule still spans `steps`
  bool print_params_only = false;
};

inline constexpr const char* kMetricsHeader = "step,loss,lr,images_per_s,elapsed_s,val_loss,val_top1,val_top5";

// Training data: an ImageFolder with RandomResizedCrop, horizontal flips and ImageNet
// normalization, or (no --data) standard-normal synthetic images, which are already in the
// range of normalized ones. Both produce their samples in the DataLoader's workers.
struct TrainData {
  std::shared_ptr<st::data::ImageFolder> folder;  // null for synthetic data
  std::shared_ptr<st::data::Dataset<st::data::Example>> dataset;
  int64_t classes = 0;
};

inline TrainData make_data(const Options& o) {
  TrainData d;
  if (o.data.empty()) {
    d.dataset = std::make_shared<st::data::SyntheticImageDataset>(o.synthetic_size, 3, o.image_size, o.image_size,
                                                                  o.classes, o.seed);
    d.classes = o.classes;
    return d;
  }
  using namespace st::data;
  Compose pipeline({RandomResizedCrop(o.image_size), RandomHorizontalFlip(), ToTensor(),
                    Normalize(kImageNetMean, kImageNetStd)});
  d.folder = std::make_shared<ImageFolder>(o.data, pipeline, o.seed);
  d.dataset = d.folder;
  d.classes = static_cast<int64_t>(d.folder->classes().size());
  return d;
}

// Validation images: resized so the shorter side is image_size * 256 / 224 (256 for 224), the
// central image_size square, ImageNet normalization (torchvision's evaluation transform). The
// folder must hold the training folder's classes, in the same order.
inline std::shared_ptr<st::data::ImageFolder> make_val_data(const Options& o, const TrainData& train) {
  if (o.val_data.empty()) return nullptr;
  STRATA_CHECK(train.folder, "[resnet50] --val-data needs --data: synthetic training images have no classes to "
                             "validate against");
  using namespace st::data;
  Compose pipeline({Resize(o.image_size * 256 / 224), CenterCrop(o.image_size), ToTensor(),
                    Normalize(kImageNetMean, kImageNetStd)});
  auto val = std::make_shared<ImageFolder>(o.val_data, pipeline, o.seed);
  STRATA_CHECK(val->classes() == train.folder->classes(),
               "[resnet50] the validation folder's classes ({}) differ from the training folder's ({})",
               fmt::join(val->classes(), ", "), fmt::join(train.folder->classes(), ", "));
  return val;
}

struct Validation {
  double loss = 0, top1 = 0, top5 = 0;  // mean cross entropy (no smoothing), accuracies in %
  int64_t images = 0;
};

// One pass over `loader` in eval mode (BatchNorm's running statistics), without autograd.
inline Validation evaluate(ResNet50& model, st::data::DataLoader<st::data::Example>& loader, st::Device device,
                           bool channels_last) {
  st::NoGradGuard no_grad;
  model.eval();
  double loss = 0;
  int64_t correct1 = 0, correct5 = 0, n = 0;
  for (auto& batch : loader) {
    st::Tensor x = batch.input.to(device);
    if (channels_last) x = x.to(st::MemoryFormat::ChannelsLast);
    const st::Tensor y = batch.target.to(device), logits = model(x);
    loss += F::cross_entropy(logits, y, {.reduction = "sum"}).item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    const st::Tensor hits = st::eq(std::get<1>(st::topk(logits, k, 1)), y.unsqueeze(1));  // (B, k), best first
    correct1 += hits.narrow(1, 0, 1).sum().item<int64_t>();
    correct5 += hits.sum().item<int64_t>();
    n += y.size(0);
  }
  model.train();
  if (n == 0) return {};
  const double scale = 100.0 / static_cast<double>(n);
  return {loss / static_cast<double>(n), correct1 * scale, correct5 * scale, n};
}

// What a checkpoint must agree on to be continued exactly (Note [Exact resume]): the model's
// classes, the batches it is fed, the loss, the learning-rate schedule (another would mix two)
// and the optimizer's options (its state carries them, so others would be ignored).
// load_checkpoint refuses another, naming the keys.
inline std::map<std::string, std::string> run_config(const Options& o, const TrainData& data) {
  std::map<std::string, std::string> config{
      {"model", "resnet50"},
      {"classes", std::to_string(data.classes)},
      {"data", o.data.empty() ? fmt::format("synthetic:{}", o.synthetic_size) : o.data},
      {"image_size", std::to_string(o.image_size)},
      {"batch", std::to_string(o.batch)},
      {"seed", std::to_string(o.seed)},
      {"weight_decay", fmt::format("{}", o.weight_decay)},
      {"label_smoothing", fmt::format("{}", o.label_smoothing)},
      {"momentum", o.optimizer == "sgd" ? fmt::format("{}", o.momentum) : "-"},
      {"nesterov", o.optimizer == "sgd" && o.nesterov ? "yes" : "no"}};
  config.merge(example::schedule_config(o.steps, o.warmup, o.lr, o.min_lr));
  if (o.amp) config["amp"] = "yes";  // only then, so checkpoints of full-precision runs keep their keys
  return config;
}

// SGD (optionally Nesterov) or LAMB; weight decay on conv and linear weights only, not on
// BatchNorm parameters or biases, as is usual for ResNets.
inline std::unique_ptr<st::optim::Optimizer> make_optimizer(ResNet50& model, const Options& o) {
  std::vector<st::Tensor> weights, others;
  for (const st::Tensor& p : model.parameters()) (p.dim() >= 2 ? weights : others).push_back(p);
  if (o.optimizer == "lamb") {
    st::optim::LAMBOptions decay{.lr = o.lr, .weight_decay = o.weight_decay}, no_decay = decay;
    no_decay.weight_decay = 0;
    using Groups = std::vector<st::optim::LAMB::Group>;
    return std::make_unique<st::optim::LAMB>(Groups{{weights, decay}, {others, no_decay}}, decay);
  }
  st::optim::SGDOptions decay{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay,
                              .nesterov = o.nesterov};
  st::optim::SGDOptions no_decay = decay;
  no_decay.weight_decay = 0;
  using Groups = std::vector<st::optim::SGD::Group>;
  return std::make_unique<st::optim::SGD>(Groups{{weights, decay}, {others, no_decay}}, decay);
}

// Runs steps [start, end), cycling over the loader's epochs, validates on `val_loader` (when
// given; every o.eval_every steps and after the last of o.steps) and checkpoints into `state` when
// o.checkpoint is set (every o.checkpoint_every steps and at the end); returns the mean images/s
// over the steps after the first timing_warmup of this run (over all of them when there are no
// more).
inline double train(const Options& o, ResNet50& model, st::optim::Optimizer& opt, st::optim::LRScheduler& schedule,
                    st::amp::GradScaler& scaler, TrainData& data, st::data::DataLoader<st::data::Example>& loader,
                    st::data::DataLoader<st::data::Example>* val_loader, st::Device device,
                    const st::io::TrainingState& state, int64_t start) {
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  // rows past the checkpoint would repeat: a resumed run trims them at its first row
  example::MetricsCsv csv(o.metrics, kMetricsHeader, start, "resnet50");
  auto save = [&](int64_t step) {
    csv.flush();  // the CSV holds every row the checkpoint covers
    example::save_checkpoint(o.checkpoint, state, {.step = step, .loader = loader.state().to_map()});
  };
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  double running = 0, timed_s = 0, all_s = 0, interval_s = 0;
  int64_t running_n = 0, step = start, timed_images = 0, all_images = 0, interval_images = 0;
  auto last = Clock::now();
  while (step < end) {
    for (auto& batch : loader) {
      // on a GPU run from pinned memory, without a wait: the forward's kernels queue behind the
      // copy (the pinned buffer is held until it is done)
      st::Tensor x = batch.input.to(device, /*non_blocking=*/true);
      if (o.channels_last) x = x.to(st::MemoryFormat::ChannelsLast);
      const double lr = schedule.get_last_lr()[0];
      const st::Tensor y = batch.target.to(device, /*non_blocking=*/true);
      st::Tensor loss;
      {
        // --amp: convolutions and the classifier in 16 bits, the loss in float32; a no-op without it
        st::amp::AutocastGuard autocast(device.type, device.is_cuda() ? st::kFloat16 : st::kBFloat16, o.amp);
        loss = F::cross_entropy(model(x), y, {.label_smoothing = o.label_smoothing});
      }
      opt.zero_grad();
      scaler.scale(loss).backward();  // without loss scaling (disabled scaler): loss.backward()
      scaler.step(opt);
      scaler.update();
      schedule.step();
      const double l = loss.item<double>();  // waits for the step to finish
      example::check_loss("resnet50", l, step + 1);
      const auto now = Clock::now();
      const double step_s = std::chrono::duration<double>(now - last).count();
      last = now;
      const int64_t n = batch.target.size(0);
      ++step;
      all_s += step_s;
      all_images += n;
      if (step - start > o.timing_warmup) {
        timed_s += step_s;
        timed_images += n;
      }
      running += l;
      ++running_n;
      interval_s += step_s;
      interval_images += n;
      const double ips = static_cast<double>(n) / std::max(step_s, 1e-9);
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      csv.row() << step << ',' << fmt::format("{}", l) << ',' << fmt::format("{}", lr) << ',' << fmt::format("{:.2f}", ips)
          << ',' << fmt::format("{:.2f}", elapsed);
      std::optional<Validation> val;
      if (val_loader && (step == o.steps || (o.eval_every > 0 && step % o.eval_every == 0))) {
        val = evaluate(model, *val_loader, device, o.channels_last);
        last = Clock::now();  // validation time is not training time
      }
      csv.row() << (val ? fmt::format(",{},{:.2f},{:.2f}", val->loss, val->top1, val->top5) : std::string(",,,")) << '\n';
      if (step % o.log_every == 0 || step == end) {
        // the loss and images/s over the steps since the last line
        std::printf("step %5lld/%lld  loss %.4f  lr %.2e  %7.2f img/s  elapsed %6.1fs\n", (long long)step,
                    (long long)o.steps, running / static_cast<double>(running_n), lr,
                    static_cast<double>(interval_images) / std::max(interval_s, 1e-9), elapsed);
        std::fflush(stdout);
        csv.flush();
        running = interval_s = 0;
        running_n = interval_images = 0;
      }
      if (val) {
        std::printf("validation at step %lld: loss %.4f  top-1 %.2f%%  top-5 %.2f%%  (%lld images)\n",
                    (long long)step, val->loss, val->top1, val->top5, (long long)val->images);
        std::fflush(stdout);
      }
      if (!o.checkpoint.empty() && (step == end || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0))) {
        save(step);
        last = Clock::now();  // nor is saving
      }
      if (step == end) break;  // mid-pass: the loader's workers stop at its next pass or its end
    }
  }
  if (timed_images == 0) return static_cast<double>(all_images) / std::max(all_s, 1e-9);
  return static_cast<double>(timed_images) / std::max(timed_s, 1e-9);
}

}  // namespace resnet
