// The end-to-end training workloads, described in plain terms so the LibTorch twins
// (train_torch.cpp, C++17) are compiled apart from strata (C++20) and share only this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace bench {

enum class Model {
  Mlp,       // 784-1024-1024-10, ReLU; AdamW
  Cnn,       // ResNet-style for 3x32x32: conv 64, two basic blocks at 64, 128/2, 256/2, pool, fc 10; SGD momentum
  ResNet50,  // torchvision ResNet-50 v1.5, 224x224, 1000 classes; SGD momentum
  Gpt,       // 6 layers, width 256, 8 heads, context 128, vocab 256, tied embedding; AdamW
};

struct TrainConfig {
  Model model;
  int64_t batch;
  uint64_t seed = 1;  // weights, synthetic inputs and targets
  bool cuda = false;  // train on the GPU
};

// The hyperparameters both libraries use; throughput does not depend on them, but the same
// update rule does the same work.
constexpr double kAdamWLr = 3e-4, kAdamWDecay = 0.01;
constexpr double kSgdLr = 0.01, kSgdMomentum = 0.9, kSgdDecay = 1e-4;

// GPT shape
constexpr int64_t kGptLayers = 6, kGptWidth = 256, kGptHeads = 8, kGptContext = 128, kGptVocab = 256;

/// Seconds since an arbitrary start, from one steady clock for both libraries.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One model, its optimizer and one fixed synthetic batch. step() is a whole training step:
/// forward, cross-entropy, zero_grad, backward, optimizer step; it returns the loss, read back
/// as a double, so the step has finished when it returns. With `phases`, the seconds of
/// forward + loss, zero_grad + backward and the optimizer step are added to phases[0..2].
class Trainer {
 public:
  virtual ~Trainer() = default;
  virtual int64_t num_parameters() const = 0;
  virtual double step(double* phases = nullptr) = 0;
};

/// The LibTorch twin of a workload, or null when the benchmark was built without LibTorch
/// (or, for a GPU run, with a LibTorch that has no CUDA).
std::unique_ptr<Trainer> make_torch_trainer(const TrainConfig& c);
/// "LibTorch 1.13" or empty without LibTorch.
std::string torch_name();
void torch_set_threads(int n);

}  // namespace bench
