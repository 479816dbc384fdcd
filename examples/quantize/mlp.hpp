// The quantization example's data, model and measurements: Fashion-MNIST as flat normalized
// rows, an MLP with three Linear layers, a short AdamW training loop, test accuracy, model
// bytes and inference throughput timed for several models side by side.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../common/run_checks.hpp"
#include "../fashion_mnist/train_loop.hpp"  // fashion::kIdxFiles, kMean, kStd

namespace qex {

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;

constexpr int64_t kPixels = 28 * 28, kClasses = 10;
// The input rows are zero-padded from 784 to 896 features, a multiple of every int4 group
// size (32, 64, 128): quantize_dynamic needs the group to divide in_features.
constexpr int64_t kFeatures = 896;

struct Split {
  st::Tensor x;  // (N, kFeatures) float32, normalized, zero beyond kPixels
  st::Tensor y;  // (N) int64
};

// The first `limit` images of a split (all when 0) as padded, normalized rows.
inline Split load_split(bool train, const std::string& dir, int64_t limit) {
  const st::data::IdxDataset set = st::data::IdxDataset::fashion_mnist(train, dir);
  const int64_t n = limit > 0 ? std::min(limit, set.size()) : set.size();
  const st::Tensor pixels = set.images().slice(0, 0, n).reshape({n, kPixels}).to(st::kFloat32);
  const st::Tensor x = (pixels / 255.0 - double(fashion::kMean)) / double(fashion::kStd);
  return {st::cat({x, st::zeros({n, kFeatures - kPixels})}, 1), set.labels().slice(0, 0, n)};
}

// Refuses a data folder that lacks any of Fashion-MNIST's four files, naming those missing.
inline void check_data_dir(const std::string& dir) {
  std::string missing;
  for (const char* file : fashion::kIdxFiles)
    if (!std::filesystem::exists(std::filesystem::path(dir) / file))
      missing += std::string(missing.empty() ? "" : ", ") + file;
  STRATA_CHECK(missing.empty(),
               "[quantize] Fashion-MNIST is not in {} (--data-dir): no {} (run scripts/setup.sh to install "
               "dataset-fashion-mnist)",
               dir, missing);
}

// kFeatures -> width -> width / 2 -> kClasses with ReLUs. The weight columns of the padding
// start at zero and stay zero (their inputs, hence their gradients, are zero; AdamW's decay
// keeps zero), so the padding changes no output and no int4 group's range.
struct Mlp : nn::Module {
  nn::Linear fc1, fc2, fc3;
  Mlp(int64_t width, st::Generator* g)
      : fc1(kFeatures, width, {.generator = g}), fc2(width, width / 2, {.generator = g}),
        fc3(width / 2, kClasses, {.generator = g}) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    st::NoGradGuard no_grad;
    fc1.weight.slice(1, kPixels, kFeatures).zero_();
  }
  st::Tensor forward(const st::Tensor& x) override { return fc3(F::relu(fc2(F::relu(fc1(x))))); }
  std::string name() const override { return "Mlp"; }
};

struct TrainOptions {
  int64_t steps = 0;
  int64_t batch = 128;
  double lr = 1e-3;
  int64_t log_every = 100;
};

// `o.steps` AdamW steps on batches drawn without replacement (a new permutation per pass),
// printing the mean loss of every `o.log_every` steps as "<phase> step S loss L".
inline void train(const char* phase, nn::Module& model, const Split& data, const TrainOptions& o, st::Generator& g) {
  st::optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = 1e-4});
  model.train();
  const int64_t n = data.x.size(0), batch = std::min(o.batch, n);
  st::Tensor order = st::randperm(n, st::TensorOptions(st::kInt64), &g);
  double sum = 0;
  int64_t summed = 0;
  for (int64_t step = 1, at = 0; step <= o.steps; ++step, at += batch) {
    if (at + batch > n) order = st::randperm(n, st::TensorOptions(st::kInt64), &g), at = 0;
    const st::Tensor idx = order.slice(0, at, at + batch);
    const st::Tensor loss = F::cross_entropy(model(st::index_select(data.x, 0, idx)), st::index_select(data.y, 0, idx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    example::check_loss("quantize", l, step);
    sum += l;
    ++summed;
    if (step % o.log_every == 0 || step == o.steps) {
      std::printf("%s step %lld/%lld loss %.4f\n", phase, (long long)step, (long long)o.steps, sum / summed);
      std::fflush(stdout);
      sum = 0;
      summed = 0;
    }
  }
}

// The test split cut into batches of `size` rows (views, made once so that timing sees forwards only).
inline std::vector<st::Tensor> batches(const st::Tensor& x, int64_t size) {
  std::vector<st::Tensor> out;
  for (int64_t at = 0; at < x.size(0); at += size) out.push_back(x.slice(0, at, std::min(at + size, x.size(0))));
  return out;
}

// The model's outputs on every batch, concatenated; in eval mode without autograd.
inline st::Tensor predict(nn::Module& model, const std::vector<st::Tensor>& inputs) {
  st::NoGradGuard no_grad;
  model.eval();
  std::vector<st::Tensor> logits;
  for (const st::Tensor& x : inputs) logits.push_back(model(x));
  return st::cat(logits, 0);
}

// Percent of the test split classified correctly.
inline double accuracy(nn::Module& model, const std::vector<st::Tensor>& inputs, const st::Tensor& labels) {
  const st::Tensor hits = st::eq(st::argmax(predict(model, inputs), 1), labels);
  return 100.0 * hits.to(st::kFloat64).mean().item<double>();
}

// Bytes of the state dict's tensors: what a checkpoint of the model holds, quantization
// parameters (scales, zero points) and biases included.
inline int64_t state_bytes(const nn::Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, t] : model.state_dict()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// Samples per second of each model's forward over `inputs`: after one warm-up pass each, the
// models take turns for `rounds` rounds (so a change of clock or load touches all alike) and
// each keeps its median pass.
inline std::vector<double> throughput(const std::vector<nn::Module*>& models, const std::vector<st::Tensor>& inputs,
                                      int64_t rounds) {
  int64_t samples = 0;
  for (const st::Tensor& x : inputs) samples += x.size(0);
  st::NoGradGuard no_grad;
  for (nn::Module* m : models) predict(*m, inputs);
  std::vector<std::vector<double>> seconds(models.size());
  for (int64_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < models.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      for (const st::Tensor& x : inputs) (*models[i])(x);
      seconds[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::vector<double> rates;
  for (auto& s : seconds) {
    std::sort(s.begin(), s.end());
    rates.push_back(static_cast<double>(samples) / std::max(s[s.size() / 2], 1e-9));
  }
  return rates;
}

}  // namespace qex
