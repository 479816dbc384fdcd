// Compresses a classifier on a synthetic task, in a few seconds on the CPU: trains a wide
// teacher MLP on a mixture of Gaussian clusters, distills a narrow student from it (Hinton's
// loss with temperature), removes the least important hidden units of the student physically
// (one global ranking over both hidden layers), then prunes half of the remaining weights with
// masks during fine-tuning, re-applying the masks after each optimizer step. Each phase prints
// its losses, the test accuracy, the parameter count and the sparsity.
#include <cstdint>
#include <cstdio>
#include <functional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <strata/strata.hpp>

#include "../common/cli.hpp"
#include "../common/run_checks.hpp"

namespace {

namespace st = strata;
namespace F = strata::nn::functional;
namespace C = strata::compress;

struct Options {
  int64_t steps = 150;      // per phase
  int64_t hidden = 64;      // the student's hidden width
  double shrink = 0.5;      // fraction of the student's hidden units removed
  double sparsity = 0.5;    // fraction of the remaining weights masked
  int threads = 1;
  uint64_t seed = 7;
};

constexpr int64_t kFeatures = 16, kClasses = 8, kBatch = 128;

struct Data {
  st::Tensor x_train, y_train, x_test, y_test;
};

// Points around kClasses random centres, with noise of the centres' own scale, so a linear
// model does not separate them all.
Data make_data(st::Generator& g) {
  const st::Tensor centres = st::randn({kClasses, kFeatures}, {}, &g);
  auto draw = [&](int64_t n) {
    const st::Tensor y = st::randint(0, kClasses, {n}, st::kInt64, &g);
    return std::pair{st::index_select(centres, 0, y) + st::randn({n, kFeatures}, {}, &g) * 0.9, y};
  };
  auto [xa, ya] = draw(4096);
  auto [xb, yb] = draw(2048);
  return {xa, ya, xb, yb};
}

st::nn::Sequential mlp(int64_t hidden, st::Generator& g) {
  return st::nn::Sequential(st::nn::Linear(kFeatures, hidden, {.generator = &g}), st::nn::ReLU(),
                            st::nn::Linear(hidden, hidden, {.generator = &g}), st::nn::ReLU(),
                            st::nn::Linear(hidden, kClasses, {.generator = &g}));
}

st::nn::Linear& layer(st::nn::Sequential& net, const char* name) {
  for (auto& [n, m] : net.named_modules())
    if (n == name) return dynamic_cast<st::nn::Linear&>(*m);
  throw st::Error(fmt::format("no layer {}", name));
}

double accuracy(st::nn::Module& net, const Data& d) {
  st::NoGradGuard no_grad;
  net.eval();
  const double acc = (st::argmax(net(d.x_test), 1) == d.y_test).to(st::kFloat64).mean().item<double>();
  net.train();
  return 100 * acc;
}

// `steps` AdamW steps on shuffled batches of `loss(x, y)`, printing the mean loss of each tenth;
// after_step(step) runs after every optimizer step.
void train(const char* phase, st::nn::Module& net, const Data& d, int64_t steps, st::Generator& g,
           const std::function<st::Tensor(const st::Tensor&, const st::Tensor&)>& loss,
           const std::function<void(int64_t)>& after_step = {}) {
  st::optim::AdamW opt(net.parameters(), {.lr = 3e-3, .weight_decay = 1e-4});  // after any shrinking
  const int64_t n = d.x_train.size(0), log_every = std::max<int64_t>(steps / 10, 1);
  st::Tensor order = st::randperm(n, st::TensorOptions(st::kInt64), &g);
  double sum = 0;
  for (int64_t step = 1, at = 0; step <= steps; ++step, at += kBatch) {
    if (at + kBatch > n) order = st::randperm(n, st::TensorOptions(st::kInt64), &g), at = 0;
    const st::Tensor idx = order.slice(0, at, at + kBatch);
    opt.zero_grad();
    const st::Tensor l = loss(st::index_select(d.x_train, 0, idx), st::index_select(d.y_train, 0, idx));
    example::check_loss(phase, l.item<double>(), step);
    l.backward();
    opt.step();
    if (after_step) after_step(step);
    sum += l.item<double>();
    if (step % log_every == 0) {
      std::printf("%s step %lld loss %.4f\n", phase, static_cast<long long>(step), sum / log_every);
      sum = 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Distill a student from a teacher, then prune it (synthetic data, CPU)"};
  app.add_option("--steps", o.steps, "optimizer steps per phase")->check(example::in_range(10, 100'000));
  app.add_option("--hidden", o.hidden, "the student's hidden width")->check(example::in_range(2, 4096));
  app.add_option("--shrink", o.shrink, "fraction of the student's hidden units removed")->check(CLI::Range(0.0, 0.9));
  app.add_option("--sparsity", o.sparsity, "fraction of the remaining weights masked")->check(CLI::Range(0.0, 0.99));
  app.add_option("--threads", o.threads, "CPU threads for the kernels (0: all)");
  app.add_option("--seed", o.seed, "random seed")->check(example::seed_value);
  example::decimal_integers(app);
  CLI11_PARSE(app, argc, argv);
  try {
    example::set_threads("compress", o.threads);
    st::Generator g(o.seed);
    const Data d = make_data(g);

    st::nn::Sequential teacher = mlp(256, g);
    train("teacher", teacher, d, o.steps, g, [&](const st::Tensor& x, const st::Tensor& y) {
      return F::cross_entropy(teacher(x), y);
    });
    std::printf("teacher: %lld parameters, test accuracy %.2f%%\n", static_cast<long long>(teacher.num_parameters()),
                accuracy(teacher, d));

    st::nn::Sequential student = mlp(o.hidden, g);
    C::Distiller kd(teacher, student, {.temperature = 4, .alpha = 0.7});
    auto distill = [&](const st::Tensor& x, const st::Tensor& y) { return kd.loss(x, y); };
    train("distill", student, d, o.steps, g, distill);
    std::printf("student: %lld parameters, test accuracy %.2f%%\n", static_cast<long long>(student.num_parameters()),
                accuracy(student, d));

    // physical pruning of both hidden layers, their groups traced from one forward, ranked
    // together by Taylor importance
    st::nn::Linear &fc1 = layer(student, "0"), &fc2 = layer(student, "2"), &fc3 = layer(student, "4");
    student.zero_grad();
    kd.loss(d.x_train, d.y_train).backward();
    C::DependencyGraph graph(student, d.x_train.narrow(0, 0, 8));
    graph.prune(o.shrink, {.importance = C::Importance::Taylor, .global = true});
    std::printf("shrunk: hidden %lld and %lld units, %lld parameters, test accuracy %.2f%%\n",
                static_cast<long long>(fc1.out_features), static_cast<long long>(fc2.out_features),
                static_cast<long long>(student.num_parameters()), accuracy(student, d));
    train("finetune", student, d, o.steps, g, distill);
    std::printf("shrunk and fine-tuned: test accuracy %.2f%%\n", accuracy(student, d));

    // mask pruning of the remaining weights a third into fine-tuning: AdamW's moments move the
    // pruned weights again, and each layer's pruning hook zeroes them before its next forward
    train("sparse", student, d, o.steps, g, distill, [&](int64_t step) {
      if (step == o.steps / 3) C::global_unstructured({{&fc1}, {&fc2}, {&fc3}}, o.sparsity);
    });
    C::reapply_masks(student);  // the last step's revived values, before reading (or saving) the weights
    const C::SparsityReport report = C::sparsity_report(student);
    std::printf("%s", report.to_string().c_str());
    std::printf("final: %lld parameters, %.2f%% of the weights zero, test accuracy %.2f%%\n",
                static_cast<long long>(student.num_parameters()), 100 * report.total.sparsity(), accuracy(student, d));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
