// The custom-kernel example: registers scaled_swish (swish.hpp) with its CPU and CUDA
// kernels, then checks it the way strata checks its own ops: forward against the composed
// reference x * sigmoid(beta * x), backward against autograd of that reference and against
// central finite differences in float64, and the CUDA kernel against the CPU one where a GPU
// is present. It also overrides a built-in kernel and restores it, and trains a small model
// that uses the op. Prints each check; exits non-zero on any mismatch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <strata/strata.hpp>

#include "swish.hpp"

namespace st = strata;
namespace F = strata::nn::functional;
using st::Tensor;
using swish::scaled_swish;

namespace {

constexpr double kBeta = 1.702;
int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? " ok " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// The same function composed from built-in ops: the independent reference.
Tensor reference(const Tensor& x, double beta) { return x * st::sigmoid(x * beta); }

// max |a - b| / (1 + |b|), computed in float64 on the CPU
double max_err(const Tensor& a, const Tensor& b) {
  Tensor a64 = a.cpu().to(st::kFloat64), b64 = b.cpu().to(st::kFloat64);
  return ((a64 - b64).abs() / (b64.abs() + 1)).max().item<double>();
}

void check_forward(st::Generator& gen) {
  std::printf("forward, CPU kernel against the composed reference:\n");
  Tensor x32 = st::randn({37, 53}, st::kFloat32, &gen) * 3;
  Tensor x64 = x32.to(st::kFloat64);
  double e32 = max_err(scaled_swish(x32, kBeta), reference(x64, kBeta));
  check(e32 < 1e-6, fmt::format("float32 (37, 53): max error {:.1e} against float64 math", e32));
  double e64 = max_err(scaled_swish(x64, kBeta), reference(x64, kBeta));
  check(e64 < 1e-15, fmt::format("float64 (37, 53): max error {:.1e}", e64));
  // a transposed view is made contiguous before the kernel; the values must not change
  check(max_err(scaled_swish(x32.t(), kBeta), scaled_swish(x32, kBeta).t()) == 0,
        "a non-contiguous input (transposed view) gives the same values");
  std::string message;
  try {
    scaled_swish(st::arange(4, st::kInt64), kBeta);
  } catch (const st::Error& e) {
    message = e.what();
  }
  check(message.starts_with("[scaled_swish]"), fmt::format("int64 input raises: \"{}\"", message));
}

void check_backward(st::Generator& gen) {
  std::printf("backward (custom autograd::Function), float64:\n");
  Tensor x = st::randn({5, 7}, st::kFloat64, &gen) * 2;
  Tensor w = st::randn({5, 7}, st::kFloat64, &gen);  // loss = sum(w * y): upstream gradient w
  auto loss_of = [&](const Tensor& in) { return (scaled_swish(in, kBeta) * w).sum(); };

  Tensor xa = x.clone().requires_grad_();
  loss_of(xa).backward();
  Tensor grad = xa.grad();
  Tensor xr = x.clone().requires_grad_();
  (reference(xr, kBeta) * w).sum().backward();
  double e_ref = max_err(grad, xr.grad());
  check(e_ref < 1e-14, fmt::format("gradient against autograd of the reference: max error {:.1e}", e_ref));

  // central differences on every element: (f(x + h e_i) - f(x - h e_i)) / 2h
  const double h = 1e-6;
  Tensor fd = st::empty({5, 7}, st::kFloat64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    Tensor xp = x.clone(), xm = x.clone();
    xp.data_ptr<double>()[i] += h;
    xm.data_ptr<double>()[i] -= h;
    fd.data_ptr<double>()[i] = (loss_of(xp).item<double>() - loss_of(xm).item<double>()) / (2 * h);
  }
  double e_fd = max_err(grad, fd);
  check(e_fd < 1e-7, fmt::format("gradient against finite differences (h = 1e-6, 35 elements): max error {:.1e}", e_fd));
}

// Replaces the CPU float32 kernel of the built-in sigmoid with our own loop, then restores it.
// Built-in ops hand kernels strided views, so a replacement either handles strides or passes
// those calls on to the kernel it replaced, as this one does.
void check_override(st::Generator& gen) {
  std::printf("overriding a built-in kernel (sigmoid, CPU, float32):\n");
  const st::OpId op = st::OpId::sigmoid;
  st::KernelFn original = st::ext::get_kernel(op, st::DeviceType::CPU, st::kFloat32);
  int ours = 0, passed_on = 0;
  st::ext::register_kernel(op, st::DeviceType::CPU, st::kFloat32, [&](const st::KernelCall& call) {
    const Tensor& x = call.inputs[0];
    Tensor& y = call.outputs[0];
    if (!x.is_contiguous() || !y.is_contiguous()) {
      ++passed_on;
      return original(call);
    }
    ++ours;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) yp[i] = 1.0f / (1.0f + std::exp(-xp[i]));
  });
  Tensor x = st::randn({64, 48}, st::kFloat32, &gen) * 4;
  Tensor expected = st::sigmoid(x.to(st::kFloat64));
  double e_dense = max_err(st::sigmoid(x), expected);
  double e_view = max_err(st::sigmoid(x.t()), expected.t());
  check(ours == 1 && passed_on == 1 && e_dense < 1e-6 && e_view < 1e-6,
        fmt::format("replacement ran on the dense call, passed the strided one on; max error {:.1e}",
                    std::max(e_dense, e_view)));
  scaled_swish(x, kBeta);
  check(ours == 1, "scaled_swish is fused: it never calls the sigmoid kernel");
  st::ext::register_kernel(op, st::DeviceType::CPU, st::kFloat32, original);
  st::sigmoid(x);
  check(ours == 1, "after restoring the original kernel the replacement is no longer called");
}

// A two-layer network with ScaledSwish between its layers; `composed` swaps in the reference.
struct Net : st::nn::Module {
  st::nn::Linear fc1{4, 16}, fc2{16, 1};
  swish::ScaledSwish act{kBeta};
  bool composed = false;
  Net() {
    register_module("fc1", fc1);
    register_module("act", act);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return fc2(composed ? reference(fc1(x), kBeta) : act(fc1(x))); }
};

void check_training(st::Generator& gen) {
  std::printf("training a module that uses the op (Linear, ScaledSwish, Linear; SGD):\n");
  Tensor x = st::randn({64, 4}, st::kFloat32, &gen);
  Tensor y = st::sin(x.sum({1}, true));
  Net net, ref;
  ref.composed = true;
  ref.load_state_dict(net.state_dict());
  Tensor loss = F::mse_loss(net(x), y);
  loss.backward();
  F::mse_loss(ref(x), y).backward();
  double e_grad = 0;
  auto ref_params = ref.named_parameters();
  for (size_t i = 0; i < ref_params.size(); ++i)
    e_grad = std::max(e_grad, max_err(net.named_parameters()[i].second.grad(), ref_params[i].second.grad()));
  check(e_grad < 1e-5, fmt::format("parameter gradients equal the composed model's: max error {:.1e}", e_grad));

  st::optim::SGD opt(net.parameters(), {.lr = 0.1});
  const double first = loss.item<double>();
  double last = first, after_one = 0;
  for (int step = 1; step <= 50; ++step) {
    opt.step();
    opt.zero_grad();
    Tensor l = F::mse_loss(net(x), y);
    l.backward();
    last = l.item<double>();
    if (step == 1) after_one = last;
  }
  check(after_one < first, fmt::format("one SGD step lowers the loss: {:.4f} -> {:.4f}", first, after_one));
  // the best constant prediction (the mean) has a loss of var(y); a model that learned beats it
  const double baseline = st::square(y - y.mean()).mean().item<double>();
  check(last < baseline, fmt::format("50 steps: loss {:.4f} -> {:.4f}, below the constant predictor's {:.4f}",
                                     first, last, baseline));
}

void check_cuda(st::Generator& gen) {
  std::printf("CUDA kernel:\n");
  if (!swish::has_cuda_kernel()) {
    std::printf("  this program was built without a CUDA compiler: ran the CPU path only\n");
    return;
  }
  if (!st::cuda::is_available()) {
    std::printf("  compiled and registered for float32 and float64, but no GPU is visible: ran the CPU path only\n");
    return;
  }
  for (st::DType dtype : {st::kFloat32, st::kFloat64}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000003}}) {
      Tensor x = st::randn({n}, dtype, &gen) * 3;
      Tensor yc = scaled_swish(x.to(st::Device::cuda()), kBeta);
      double e = n == 0 ? 0 : max_err(yc, scaled_swish(x, kBeta));
      double tol = dtype == st::kFloat32 ? 1e-6 : 1e-15;
      check(yc.is_cuda() && yc.numel() == n && e <= tol,
            fmt::format("{} n = {}: CUDA against CPU, max error {:.1e}", dtype, n, e));
    }
  }
  {  // on a user stream, which does not wait for the default one: the kernel must follow the
     // copy that makes the transposed input contiguous on that stream
    Tensor x = st::randn({4096, 4096}, st::kFloat32, &gen);
    Tensor xc = x.to(st::Device::cuda());
    st::cuda::Stream::current().synchronize();
    const st::cuda::Stream side = st::cuda::Stream::create();
    Tensor yc;
    {
      st::cuda::StreamGuard guard(side);
      yc = scaled_swish(xc.t(), kBeta);
    }
    side.synchronize();
    double e = max_err(yc, scaled_swish(x.t(), kBeta));
    check(e <= 1e-6,
          fmt::format("float32 (4096, 4096) transposed, under a StreamGuard on a user stream: max error {:.1e}", e));
  }
  // backward composes built-in ops, so it runs on the GPU once those ops have CUDA kernels
  bool ops_on_gpu = true;
  for (st::OpId op : {st::OpId::sigmoid, st::OpId::mul, st::OpId::add, st::OpId::sub, st::OpId::sum, st::OpId::fill})
    ops_on_gpu = ops_on_gpu && st::ext::has_kernel(op, st::DeviceType::CUDA, st::kFloat64);
  if (!ops_on_gpu) {
    std::printf("  backward on the GPU not run: strata has no CUDA kernels for sigmoid/mul/add/sub/sum/fill in this build\n");
    return;
  }
  Tensor x = st::randn({1000}, st::kFloat64, &gen);
  Tensor xc = x.to(st::Device::cuda()).requires_grad_();
  scaled_swish(xc, kBeta).sum().backward();
  Tensor xh = x.clone().requires_grad_();
  scaled_swish(xh, kBeta).sum().backward();
  double e = max_err(xc.grad(), xh.grad());
  check(e < 1e-14, fmt::format("float64 backward on CUDA against CPU: max error {:.1e}", e));
}

}  // namespace

int main() {
  try {
    const st::OpId op = swish::register_scaled_swish();
    std::printf("registered op \"%s\" (id %d): CPU kernels for float32, float64%s\n",
                std::string(st::op_name(op)).c_str(), static_cast<int>(op),
                swish::has_cuda_kernel() ? "; CUDA kernels for float32, float64" : "");
    st::Generator gen(2024);
    check_forward(gen);
    check_backward(gen);
    check_override(gen);
    check_training(gen);
    check_cuda(gen);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  if (failures == 0) std::printf("all checks passed\n");
  else std::printf("%d check(s) FAILED\n", failures);
  return failures == 0 ? 0 : 1;
}
