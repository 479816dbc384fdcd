// The example's options, data and loops: normalized (and optionally augmented) Fashion-MNIST
// images, the optimizer with its one-cycle schedule, one training epoch and the test pass.
//
// Augmentation happens in the dataset's get(), so it runs in the DataLoader's worker threads.
// Each sample draws from its own generator, seeded by (seed, index, epoch), so a run does not
// depend on the worker count.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <strata/strata.hpp>

#include "../common/run_checks.hpp"
#include "model.hpp"

namespace fashion {

namespace F = strata::nn::functional;

struct Options {
  int64_t width = 32;
  int64_t epochs = 4;
  int64_t batch = 128;
  double lr = 0.1;  // peak of the one-cycle schedule
  double weight_decay = 5e-4;
  double label_smoothing = 0.1;
  std::string optimizer = "sgd";
  std::string augment = "none";  // short runs underfit; flip or crop pay off over longer ones
  int64_t workers = 1;
  int threads = 0;
  uint64_t seed = 1;
  std::string data_dir = st::data::fashion_mnist_dir();
  int64_t limit_train = 0;  // 0: all 60000
  int64_t limit_test = 0;   // 0: all 10000
  int64_t log_every = 100;
  std::string metrics = "fashion_mnist_metrics.csv";
  std::string weights = "fashion_mnist.safetensors";
};

// Fashion-MNIST's four files, as Debian's dataset-fashion-mnist installs them.
constexpr const char* kIdxFiles[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                     "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

// Fashion-MNIST's pixel mean and standard deviation over the training set.
constexpr float kMean = 0.2860f, kStd = 0.3530f;

// The first `limit` images of an IDX split (all when 0), normalized; with augmentation a
// random horizontal flip ("flip") and also a random shift of up to 2 pixels with zero fill,
// the same as a random crop of the image padded by 2 ("crop").
class FashionImages : public st::data::Dataset<st::data::Example> {
 public:
  FashionImages(const st::data::IdxDataset& split, int64_t limit, std::string augment, uint64_t seed)
      : images_(split.images()), labels_(split.labels()), augment_(std::move(augment)), seed_(seed) {
    STRATA_CHECK(augment_ == "none" || augment_ == "flip" || augment_ == "crop",
                 "[fashion_mnist] unknown augmentation '{}' (none, flip or crop)", augment_);
    STRATA_CHECK(limit >= 0, "[fashion_mnist] negative limit {}", limit);
    size_ = limit > 0 ? std::min(limit, images_.size(0)) : images_.size(0);
  }
  int64_t size() const override { return size_; }
  // The DataLoader calls it as each pass starts: later samples draw from this epoch's generators.
  void set_epoch(int64_t epoch) override { epoch_.store(epoch); }

  st::data::Example get(int64_t index) const override {
    STRATA_CHECK(index >= 0 && index < size_, "[fashion_mnist] index {} out of range for {} images", index, size_);
    const int64_t H = images_.size(1), W = images_.size(2);
    const uint8_t* src = images_.data_ptr<uint8_t>() + index * H * W;
    bool flip = false;
    int64_t dy = 0, dx = 0;
    if (augment_ != "none") {
      st::Generator g = st::data::sample_generator(seed_, index, static_cast<uint64_t>(epoch_.load()));
      flip = st::data::uniform(g) < 0.5;
      if (augment_ == "crop") {
        dy = static_cast<int64_t>(st::data::uniform(g) * 5) - 2;
        dx = static_cast<int64_t>(st::data::uniform(g) * 5) - 2;
      }
    }
    st::Tensor input = st::empty({1, H, W}, st::kFloat32);
    float* dst = input.data_ptr<float>();
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sy = y + dy, sx0 = x + dx, sx = flip ? W - 1 - sx0 : sx0;
        const float v = sy >= 0 && sy < H && sx >= 0 && sx < W ? src[sy * W + sx] / 255.0f : 0.0f;
        dst[y * W + x] = (v - kMean) / kStd;
      }
    }
    return {std::move(input), st::scalar_tensor(labels_.data_ptr<int64_t>()[index], st::kInt64)};
  }

 private:
  st::Tensor images_, labels_;
  std::string augment_;
  uint64_t seed_;
  int64_t size_;
  std::atomic<int64_t> epoch_{0};
};

// SGD with Nesterov momentum or AdamW; weight decay on conv and linear weights only.
inline std::unique_ptr<st::optim::Optimizer> make_optimizer(Net& model, const Options& o) {
  std::vector<st::Tensor> weights, others;
  for (const st::Tensor& p : model.parameters()) (p.dim() >= 2 ? weights : others).push_back(p);
  if (o.optimizer == "adamw") {
    st::optim::AdamWOptions decay{.lr = o.lr, .weight_decay = o.weight_decay}, no_decay = decay;
    no_decay.weight_decay = 0;
    using Groups = std::vector<st::optim::AdamW::Group>;
    return std::make_unique<st::optim::AdamW>(Groups{{weights, decay}, {others, no_decay}}, decay);
  }
  st::optim::SGDOptions decay{.lr = o.lr, .momentum = 0.9, .weight_decay = o.weight_decay, .nesterov = true};
  st::optim::SGDOptions no_decay = decay;
  no_decay.weight_decay = 0;
  return std::make_unique<st::optim::SGD>(std::vector<st::optim::SGD::Group>{{weights, decay}, {others, no_decay}},
                                          decay);
}

struct TestResult {
  double loss = 0;      // plain cross entropy, no label smoothing
  double accuracy = 0;  // fraction correct
};

inline TestResult evaluate(Net& model, st::data::DataLoader<st::data::Example>& loader) {
  st::NoGradGuard no_grad;
  model.eval();
  double loss = 0;
  int64_t correct = 0, seen = 0;
  for (auto& batch : loader) {
    st::Tensor logits = model(batch.input);
    const int64_t n = batch.target.size(0);
    loss += F::cross_entropy(logits, batch.target).item<double>() * static_cast<double>(n);
    correct += st::eq(logits.argmax(1), batch.target).sum().item<int64_t>();
    seen += n;
  }
  model.train();
  return {loss / static_cast<double>(seen), static_cast<double>(correct) / static_cast<double>(seen)};
}

// One pass over the training set; returns the mean training loss (with label smoothing).
// `t0` is the start of the run, for the elapsed time on the progress lines.
inline double train_epoch(const Options& o, int64_t epoch, Net& model, st::optim::Optimizer& opt,
                          st::optim::LRScheduler& schedule, st::data::DataLoader<st::data::Example>& loader,
                          std::chrono::steady_clock::time_point t0) {
  double total = 0, running = 0;
  int64_t steps = 0, running_n = 0, images = 0;
  auto last = std::chrono::steady_clock::now();
  for (auto& batch : loader) {
    st::Tensor logits = model(batch.input);
    st::Tensor loss = F::cross_entropy(logits, batch.target, {.label_smoothing = o.label_smoothing});
    opt.zero_grad();
    loss.backward();
    opt.step();
    schedule.step();
    const double l = loss.item<double>();
    example::check_loss("fashion_mnist", l, steps + 1);
    total += l;
    running += l;
    ++steps;
    ++running_n;
    images += batch.target.size(0);
    if (steps % o.log_every == 0) {
      auto now = std::chrono::steady_clock::now();
      double ips = static_cast<double>(images) / std::max(std::chrono::duration<double>(now - last).count(), 1e-9);
      std::printf("epoch %lld  step %4lld/%lld  loss %.4f  lr %.2e  %6.0f img/s  elapsed %6.1fs\n",
                  (long long)epoch, (long long)steps, (long long)loader.size(), running / running_n,
                  schedule.get_last_lr()[0], ips, std::chrono::duration<double>(now - t0).count());
      std::fflush(stdout);
      running = 0;
      running_n = 0;
      images = 0;
      last = now;
    }
  }
  return total / static_cast<double>(std::max<int64_t>(steps, 1));
}

}  // namespace fashion
