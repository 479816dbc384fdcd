// The LibTorch twins of the training workloads, written with LibTorch's C++ frontend
// (torch::nn, torch::optim) the way a C++ team would write them, layer for layer the same as
// the strata models in bench_train.cpp and examples/ (same shapes, same parameter counts).
// Compiled as its own C++17 object library: LibTorch 1.13's headers predate C++20.
#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <string>

#include "gpt_torch.hpp"
#include "train_workload.h"

namespace bench {

namespace {

namespace tnn = torch::nn;

tnn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding) {
  return tnn::Conv2d(tnn::Conv2dOptions(in, out, k).stride(stride).padding(padding).bias(false));
}

// 784-1024-1024-10 with ReLU
struct MlpImpl : tnn::Module {
  tnn::Linear fc1{784, 1024}, fc2{1024, 1024}, fc3{1024, 10};
  MlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
};
TORCH_MODULE(Mlp);

// conv 3x3 -> BN -> ReLU -> conv 3x3 -> BN, plus the input (projected by a strided 1x1 conv and
// BN when the shape changes), then ReLU
struct BasicBlockImpl : tnn::Module {
  tnn::Conv2d conv1, conv2;
  tnn::BatchNorm2d bn1, bn2;
  tnn::Sequential downsample{nullptr};
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(conv(in, out, 3, stride, 1)), conv2(conv(out, out, 3, 1, 1)), bn1(out), bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out)
      downsample = register_module("downsample", tnn::Sequential(conv(in, out, 1, stride, 0), tnn::BatchNorm2d(out)));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(h + (downsample.is_empty() ? x : downsample->forward(x)));
  }
};
TORCH_MODULE(BasicBlock);

struct CnnImpl : tnn::Module {
  tnn::Conv2d stem = conv(3, 64, 3, 1, 1);
  tnn::BatchNorm2d bn{64};
  tnn::Sequential layers;
  tnn::Linear fc{256, 10};
  CnnImpl() {
    register_module("stem", stem);
    register_module("bn", bn);
    int64_t in = 64;
    for (int64_t width : {64, 128, 256})
      for (int b = 0; b < 2; ++b) {
        layers->push_back(BasicBlock(in, width, b == 0 && width != 64 ? 2 : 1));
        in = width;
      }
    register_module("layers", layers);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = layers->forward(torch::relu(bn(stem(x))));
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
};
TORCH_MODULE(Cnn);

// torchvision's ResNet-50 v1.5 bottleneck (stride on the 3x3 conv)
struct BottleneckImpl : tnn::Module {
  tnn::Conv2d conv1, conv2, conv3;
  tnn::BatchNorm2d bn1, bn2, bn3;
  tnn::Sequential downsample{nullptr};
  BottleneckImpl(int64_t in, int64_t width, int64_t stride)
      : conv1(conv(in, width, 1, 1, 0)), conv2(conv(width, width, 3, stride, 1)), conv3(conv(width, 4 * width, 1, 1, 0)),
        bn1(width), bn2(width), bn3(4 * width) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("conv3", conv3);
    register_module("bn3", bn3);
    if (stride != 1 || in != 4 * width)
      downsample = register_module("downsample",
                                   tnn::Sequential(conv(in, 4 * width, 1, stride, 0), tnn::BatchNorm2d(4 * width)));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::relu(bn1(conv1(x)));
    h = torch::relu(bn2(conv2(h)));
    h = bn3(conv3(h));
    return torch::relu(h + (downsample.is_empty() ? x : downsample->forward(x)));
  }
};
TORCH_MODULE(Bottleneck);

struct ResNet50Impl : tnn::Module {
  tnn::Conv2d conv1 = conv(3, 64, 7, 2, 3);
  tnn::BatchNorm2d bn1{64};
  tnn::Sequential layer1, layer2, layer3, layer4;
  tnn::Linear fc{2048, 1000};
  ResNet50Impl() {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    const int64_t blocks[4] = {3, 4, 6, 3};
    tnn::Sequential* stages[4] = {&layer1, &layer2, &layer3, &layer4};
    int64_t in = 64;
    for (int s = 0; s < 4; ++s) {
      const int64_t width = int64_t{64} << s;
      for (int64_t b = 0; b < blocks[s]; ++b) {
        (*stages[s])->push_back(Bottleneck(in, width, b == 0 && s > 0 ? 2 : 1));
        in = 4 * width;
      }
      register_module("layer" + std::to_string(s + 1), *stages[s]);
    }
    register_module("fc", fc);
    for (auto& m : modules(/*include_self=*/false))
      if (auto* c = m->as<tnn::Conv2d>()) tnn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::max_pool2d(torch::relu(bn1(conv1(x))), 3, 2, 1);
    h = layer4->forward(layer3->forward(layer2->forward(layer1->forward(h))));
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
};
TORCH_MODULE(ResNet50);

template <class Net>
class TorchTrainer final : public Trainer {
 public:
  TorchTrainer(Net net, bool adamw, torch::Tensor x, torch::Tensor y, torch::Device device)
      : net_(std::move(net)), x_(x.to(device)), y_(y.to(device)) {
    net_->to(device);
    if (adamw)
      opt_ = std::make_unique<torch::optim::AdamW>(net_->parameters(),
                                                   torch::optim::AdamWOptions(kAdamWLr).weight_decay(kAdamWDecay));
    else
      opt_ = std::make_unique<torch::optim::SGD>(
          net_->parameters(), torch::optim::SGDOptions(kSgdLr).momentum(kSgdMomentum).weight_decay(kSgdDecay));
  }
  int64_t num_parameters() const override {
    int64_t n = 0;
    for (const auto& p : net_->parameters()) n += p.numel();
    return n;
  }
  double step(double* phases) override {
    const double t0 = phases ? now_seconds() : 0;
    torch::Tensor logits = net_->forward(x_);
    if (logits.dim() == 3) logits = logits.flatten(0, 1);  // (B * T, vocab)
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y_);
    const double t1 = phases ? now_seconds() : 0;
    // zero_grad with set_to_none, as strata's default (and PyTorch 2's): 1.13's C++
    // Optimizer::zero_grad() only zeroes the gradients in place
    for (auto& p : net_->parameters()) p.mutable_grad().reset();
    loss.backward();
    const double t2 = phases ? now_seconds() : 0;
    opt_->step();
    const double l = loss.item<double>();
    if (phases) phases[0] += t1 - t0, phases[1] += t2 - t1, phases[2] += now_seconds() - t2;
    return l;
  }

 private:
  Net net_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  torch::Tensor x_, y_;
};

template <class Net>
std::unique_ptr<Trainer> make(bool adamw, torch::Tensor x, torch::Tensor y, torch::Device device, Net net = Net()) {
  return std::make_unique<TorchTrainer<Net>>(std::move(net), adamw, std::move(x), std::move(y), device);
}

}  // namespace

std::unique_ptr<Trainer> make_torch_trainer(const TrainConfig& c) {
  if (c.cuda && !torch::cuda::is_available()) return nullptr;
  const torch::Device dev = c.cuda ? torch::kCUDA : torch::kCPU;
  // full float32 on both sides: LibTorch lets cuDNN use TF32 by default, strata does not
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  torch::manual_seed(c.seed);
  const int64_t B = c.batch;
  const auto classes = [&](int64_t n, torch::IntArrayRef shape) { return torch::randint(0, n, shape, torch::kLong); };
  switch (c.model) {
    case Model::Mlp: return make<Mlp>(true, torch::randn({B, 784}), classes(10, {B}), dev);
    case Model::Cnn: return make<Cnn>(false, torch::randn({B, 3, 32, 32}), classes(10, {B}), dev);
    case Model::ResNet50: return make<ResNet50>(false, torch::randn({B, 3, 224, 224}), classes(1000, {B}), dev);
    case Model::Gpt: {
      GptConfig gpt;
      gpt.vocab = kGptVocab, gpt.context = kGptContext, gpt.layers = kGptLayers, gpt.width = kGptWidth;
      gpt.heads = kGptHeads;
      return make<Gpt>(true, classes(kGptVocab, {B, kGptContext}), classes(kGptVocab, {B * kGptContext}), dev, Gpt(gpt));
    }
  }
  return nullptr;
}

std::string torch_name() {
  return "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
}

void torch_set_threads(int n) { at::set_num_threads(n); }

}  // namespace bench
