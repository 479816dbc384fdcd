// End-to-end learning: a small MLP and a small CNN trained with plain full-batch gradient
// descent (p -= lr * grad, written here, no optimizer) on fixed synthetic tasks that no
// linear model solves, reaching a stated loss and held-out accuracy.
#include <cmath>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::values;
namespace F = strata::nn::functional;

namespace {

void sgd_step(nn::Module& m, double lr) {
  NoGradGuard no_grad;
  for (Tensor& p : m.parameters())
    if (p.grad().defined()) p.sub_(p.grad(), lr);
  m.zero_grad();
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  std::vector<double> pred = values(logits.argmax(1)), want = values(labels);
  double hit = 0;
  for (size_t i = 0; i < pred.size(); ++i) hit += pred[i] == want[i];
  return hit / static_cast<double>(pred.size());
}

// Points in [-1, 1]^2 labelled by quadrant parity (XOR), kept 0.1 away from the axes.
std::pair<Tensor, Tensor> xor_points(int64_t n, Generator& g) {
  std::vector<double> u = values(rand({4 * n, 2}, kFloat64, &g));
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (size_t i = 0; i < u.size() && static_cast<int64_t>(ys.size()) < n; i += 2) {
    double a = 2 * u[i] - 1, b = 2 * u[i + 1] - 1;
    if (std::fabs(a) < 0.1 || std::fabs(b) < 0.1) continue;
    xs.push_back(static_cast<float>(a));
    xs.push_back(static_cast<float>(b));
    ys.push_back((a > 0) != (b > 0));
  }
  return {from_vector(xs, Shape{n, 2}), from_vector(ys)};
}

// 8x8 one-channel images of a bar at a random place, on noise: 0 horizontal, 1 vertical,
// 2 diagonal, 3 anti-diagonal (3 pixels long).
std::pair<Tensor, Tensor> bar_images(int64_t n, Generator& g) {
  std::vector<double> noise = values(randn({n, 64}, kFloat64, &g)), u = values(rand({n, 3}, kFloat64, &g));
  std::vector<float> img(static_cast<size_t>(n * 64));
  std::vector<int64_t> label(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(u[i * 3] * 4) % 4;
    const int64_t r0 = 1 + static_cast<int64_t>(u[i * 3 + 1] * 5), c0 = 1 + static_cast<int64_t>(u[i * 3 + 2] * 5);
    label[i] = c;
    float* im = img.data() + i * 64;
    for (int64_t k = 0; k < 64; ++k) im[k] = static_cast<float>(0.3 * noise[i * 64 + k]);
    for (int64_t t = -1; t <= 1; ++t) {
      const int64_t r = c == 0 ? r0 : r0 + t, col = c == 1 ? c0 : c == 3 ? c0 - t : c0 + t;
      im[r * 8 + col] += 1.0f;
    }
  }
  return {from_vector(img, Shape{n, 1, 8, 8}), from_vector(label)};
}

}  // namespace

TEST(Training, MlpLearnsXorWithGradientDescent) {
  Generator g(1);
  auto [x, y] = xor_points(256, g);
  auto [xt, yt] = xor_points(256, g);
  auto run = [&](int steps) {
    Generator init(2);
    nn::Sequential mlp(nn::Linear(2, 32, {.generator = &init}), nn::Tanh(), nn::Linear(32, 32, {.generator = &init}),
                       nn::Tanh(), nn::Linear(32, 2, {.generator = &init}));
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      Tensor loss = F::cross_entropy(mlp(x), y);
      losses.push_back(loss.item<double>());
      loss.backward();
      sgd_step(mlp, 0.5);
    }
    NoGradGuard no_grad;
    losses.push_back(F::cross_entropy(mlp(x), y).item<double>());
    losses.push_back(accuracy(mlp(xt), yt));
    return losses;
  };
  std::vector<double> l = run(400);
  const double final_loss = l[l.size() - 2], test_acc = l.back();
  EXPECT_NEAR(l[0], std::log(2.0), 0.15);  // starts near chance
  EXPECT_LT(final_loss, 0.05);  // 0.0046 when written
  EXPECT_GE(test_acc, 0.97);    // 1.0 when written
  // a fixed seed repeats the run exactly
  std::vector<double> again = run(20);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(again[i], l[i]) << i;
}

TEST(Training, CnnLearnsBarOrientationWithGradientDescent) {
  Generator g(3);
  auto [x, y] = bar_images(256, g);
  auto [xt, yt] = bar_images(256, g);
  Generator init(4);
  nn::Sequential cnn(nn::Conv2d(1, 8, 3, {.padding = 1, .generator = &init}), nn::BatchNorm2d(8), nn::ReLU(),
                     nn::MaxPool2d(2), nn::Conv2d(8, 16, 3, {.padding = 1, .generator = &init}), nn::ReLU(),
                     nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(16, 4, {.generator = &init}));
  double first = 0, last = 0;
  // lr 0.5 trained too, but chaotically: the final eval loss moved between 0.03 and 0.26 with
  // the rounding of the convolution kernels; at 0.3 it lands near 0.03 whatever the kernels.
  for (int s = 0; s < 400; ++s) {
    Tensor loss = F::cross_entropy(cnn(x), y);
    if (s == 0) first = loss.item<double>();
    loss.backward();
    sgd_step(cnn, 0.3);
  }
  cnn.eval();  // BatchNorm on its running statistics
  NoGradGuard no_grad;
  last = F::cross_entropy(cnn(x), y).item<double>();
  const double test_acc = accuracy(cnn(xt), yt);
  EXPECT_NEAR(first, std::log(4.0), 0.2);
  EXPECT_LT(last, 0.1);  // 0.035 when written (0.031 in float64)
  EXPECT_GE(test_acc, 0.93);  // 0.965 when written
}
