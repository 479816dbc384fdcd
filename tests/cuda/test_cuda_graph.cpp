// CUDA graphs on a real GPU: replays against eager runs on new static inputs, a whole
// forward + backward + SGD step graphed and replayed against eager steps, fresh random draws
// per replay (equal to the eager draws from the same generator state), the refusals (nested
// capture, the default stream, synchronizing calls, host copies, host-step optimizers), and the
// graph pool (sharing between graphs, memory given back on reset).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "cuda_testing.h"

namespace cuda = strata::cuda;
using namespace strata;
using cuda_testing::gpu;
using cuda_testing::host;

namespace {

// Runs `body`, expecting a strata::Error whose message contains `needle`.
template <class F>
void expect_error(F body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "expected an Error mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// y = relu(x * 2 + 1) @ w, in float64 on the CPU: the reference of the captured ops.
Tensor reference(const Tensor& x, const Tensor& w) {
  return matmul(relu(x.to(kFloat64) * 2 + 1), w.to(kFloat64));
}

}  // namespace

// Runs with or without a GPU: an empty graph refuses to replay, and nothing is capturing.
TEST(CudaGraph, EmptyGraphRefusesToReplay) {
  cuda::Graph graph;
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(graph.num_nodes(), 0);
  expect_error([&] { graph.replay(); }, "nothing captured");
  EXPECT_THROW(graph.capture_begin(), Error);  // the default stream, or no GPU at all
  EXPECT_FALSE(cuda::is_current_stream_capturing());
  graph.reset();  // harmless when empty
}

TEST(CudaGraph, ReplaysTheCapturedOpsOnNewStaticInputs) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  Tensor w_cpu = cuda_testing::random({64, 32}, kFloat32);
  Tensor x = gpu(cuda_testing::random({16, 64}, kFloat32)), w = gpu(w_cpu);
  cuda::Graph graph;
  Tensor y;
  {
    cuda::GraphCapture capture(graph);
    y = matmul(relu(x * 2 + 1), w);  // a temporary (x * 2) freed inside the capture
  }
  ASSERT_TRUE(graph.captured());
  EXPECT_GE(graph.num_nodes(), 3);
  for (int i = 0; i < 3; ++i) {
    const Tensor fresh = cuda_testing::random({16, 64}, kFloat32);
    x.copy_(gpu(fresh));  // new data into the static input, outside the graph
    graph.replay();
    cuda_testing::expect_close(reference(fresh, w_cpu).to(kFloat32), y, "replay " + std::to_string(i), 1e-4, 1e-5);
  }
  expect_error([&] { graph.capture_begin(); }, "reset()");
  graph.reset();
  EXPECT_FALSE(graph.captured());
  expect_error([&] { graph.replay(); }, "nothing captured");
}

// A two-layer regression model as plain parameter tensors; step() is one training step.
struct TinyModel {
  std::vector<Tensor> params;  // w1 (8, 16), b1 (16), w2 (16, 4), b2 (4)
  explicit TinyModel(const std::vector<Tensor>& init) {
    for (const Tensor& t : init) params.push_back(gpu(t).requires_grad_());
  }
  Tensor loss(const Tensor& x, const Tensor& target) const {
    const Tensor h = relu(matmul(x, params[0]) + params[1]);
    return nn::functional::mse_loss(matmul(h, params[2]) + params[3], target);
  }
};

// Three eager warm-up steps on batch 0, then batches 1..3: eagerly with one optimizer, and
// graphed (capture_step's warm-up, then one replay per batch) with its twin. Losses, weights
// and step counts must agree. With `schedule`, the learning rate changes before every step
// after the warm-up, on both optimizers (set_lr, as a scheduler does).
template <class Opt, class Options>
void check_graphed_step(const Options& opts, bool schedule = false) {
  SEED_TRACE();
  const std::vector<Tensor> init = {cuda_testing::random({8, 16}, kFloat32), cuda_testing::random({16}, kFloat32),
                                    cuda_testing::random({16, 4}, kFloat32), cuda_testing::random({4}, kFloat32)};
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 4; ++i)
    batches.emplace_back(cuda_testing::random({32, 8}, kFloat32), cuda_testing::random({32, 4}, kFloat32));
  TinyModel eager(init), graphed(init);
  Opt eager_opt(eager.params, opts), graphed_opt(graphed.params, opts);
  std::vector<double> eager_losses;
  auto lr_of = [&](int batch) { return schedule ? opts.lr * (1.0 + 0.5 * batch) : opts.lr; };
  for (int i : {0, 0, 0, 1, 2, 3}) {
    eager_opt.set_lr(0, lr_of(i));
    eager_opt.zero_grad();
    Tensor loss = eager.loss(gpu(batches[static_cast<size_t>(i)].first), gpu(batches[static_cast<size_t>(i)].second));
    loss.backward();
    eager_opt.step();
    eager_losses.push_back(loss.item<double>());
  }
  Tensor x = gpu(batches[0].first), target = gpu(batches[0].second), static_loss;
  cuda::Graph graph;
  cuda::capture_step(graph, [&] {
    graphed_opt.zero_grad();
    static_loss = graphed.loss(x, target);
    static_loss.backward();
    graphed_opt.step();
  }, /*warmup=*/3);
  EXPECT_EQ(graphed_opt.state(graphed.params[0])->step, 3);  // the capture itself ran nothing
  for (int i : {1, 2, 3}) {
    x.copy_(gpu(batches[static_cast<size_t>(i)].first));
    target.copy_(gpu(batches[static_cast<size_t>(i)].second));
    graphed_opt.set_lr(0, lr_of(i));
    graph.replay();
    const double want = eager_losses[static_cast<size_t>(i + 2)];
    EXPECT_NEAR(static_loss.item<double>(), want, 1e-5 * std::abs(want) + 1e-6) << "batch " << i;
  }
  for (size_t k = 0; k < init.size(); ++k) {
    cuda_testing::expect_close(host(eager.params[k]), graphed.params[k], "param " + std::to_string(k), 1e-5, 1e-6);
    EXPECT_EQ(graphed_opt.state(graphed.params[k])->step, eager_opt.state(eager.params[k])->step);
  }
}

TEST(CudaGraph, WholeTrainingStepWithSgdMatchesEagerSteps) {
  SKIP_WITHOUT_GPU();
  check_graphed_step<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
}

TEST(CudaGraph, WholeTrainingStepWithAdamWMatchesEagerSteps) {
  SKIP_WITHOUT_GPU();  // bias corrections change every step: they reach the graph through replay slots
  check_graphed_step<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.01});
}

TEST(CudaGraph, GraphedAdamWFollowsTheLearningRateSchedule) {
  SKIP_WITHOUT_GPU();  // step size and decay are computed from the group's lr at each replay
  check_graphed_step<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.01}, /*schedule=*/true);
}

TEST(CudaGraph, RandomDrawsAreFreshOnEachReplayAndMatchEagerDraws) {
  SKIP_WITHOUT_GPU();
  Tensor x = ones({4099}, TensorOptions(kFloat32, Device::cuda()));
  Generator gen(123);
  cuda::Graph graph;
  Tensor y, z;
  {
    cuda::GraphCapture capture(graph);
    y = nn::functional::dropout(x, 0.5, true, &gen);
    z = randn({1001}, TensorOptions(kFloat32, Device::cuda()), &gen);
  }
  gen.manual_seed(7);
  std::vector<Tensor> replayed_y, replayed_z;
  for (int i = 0; i < 2; ++i) {
    graph.replay();
    replayed_y.push_back(host(y));
    replayed_z.push_back(host(z));
  }
  EXPECT_FALSE(equal(replayed_y[0], replayed_y[1]));  // a new mask per replay
  EXPECT_FALSE(equal(replayed_z[0], replayed_z[1]));
  gen.manual_seed(7);  // the same draws, eagerly, in the same order
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(equal(host(nn::functional::dropout(x, 0.5, true, &gen)), replayed_y[static_cast<size_t>(i)]));
    EXPECT_TRUE(equal(host(randn({1001}, TensorOptions(kFloat32, Device::cuda()), &gen)),
                      replayed_z[static_cast<size_t>(i)]));
  }
}

TEST(CudaGraph, RefusesNestedCaptureAndTheDefaultStream) {
  SKIP_WITHOUT_GPU();
  Tensor x = ones({8}, TensorOptions(kFloat32, Device::cuda()));
  cuda::Graph outer, inner, on_default;
  Tensor y;
  {
    cuda::GraphCapture capture(outer);
    expect_error([&] { cuda::GraphCapture nested(inner); }, "nested capture");
    expect_error([&] { inner.capture_begin(); }, "nested capture");
    EXPECT_TRUE(cuda::is_current_stream_capturing());
    y = x + 1;
  }
  EXPECT_FALSE(cuda::is_current_stream_capturing());
  outer.replay();
  cuda_testing::expect_close(full({8}, 2.0f), y, "after the refused nested capture", 0);
  expect_error([&] { on_default.capture_begin(); }, "default stream");
}

TEST(CudaGraph, CaptureUnsafeCallsRaiseNamingThemselves) {
  SKIP_WITHOUT_GPU();
  Tensor x = ones({64}, TensorOptions(kFloat32, Device::cuda()));
  Tensor p = x.clone().requires_grad_(), q = x.clone().requires_grad_();
  optim::LAMB lamb({p}, {.lr = 1e-3});
  optim::AdamW adamw({q}, {.lr = 1e-3});  // never stepped: its moments do not exist yet
  cuda::Graph graph;
  Tensor y;
  {
    cuda::GraphCapture capture(graph);
    expect_error([&] { (void)x.sum().item<float>(); }, "[copy]");
    expect_error([&] { (void)host(x); }, "[copy]");
    expect_error([&] { cuda::synchronize(); }, "[synchronize]");
    expect_error([&] { cuda::Stream::current().synchronize(); }, "[Stream::synchronize]");
    expect_error([&] { cuda::empty_cache(); }, "empty_cache");
    p.set_grad(x * 0.5);
    q.set_grad(x * 0.5);
    expect_error([&] { lamb.step(); }, "[LAMB]");
    expect_error([&] { adamw.step(); }, "warm-up");
    y = x * 3;  // the capture survives the refused calls
  }
  graph.replay();
  cuda_testing::expect_close(full({64}, 3.0f), y, "captured after the refusals", 0);
  // an exception leaving the capture scope abandons the capture and leaves the stream usable
  cuda::Graph failed;
  const int64_t pool_bytes = cuda::memory_stats().graph_pool_bytes;
  EXPECT_THROW(
      {
        cuda::GraphCapture capture(failed);
        (void)(x * 2);
        throw Error("the step failed");
      },
      Error);
  EXPECT_FALSE(failed.captured());
  EXPECT_EQ(cuda::memory_stats().graph_pool_bytes, pool_bytes);  // its pool went back at once
  cuda_testing::expect_close(full({64}, 2.0f), x * 2, "eager after the abandoned capture", 0);
}

TEST(CudaGraph, GraphsSharingAPoolReuseItsMemory) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 18;  // 1 MiB of float32
  Tensor x = ones({n}, TensorOptions(kFloat32, Device::cuda()));
  const int64_t before = cuda::memory_stats().graph_pool_bytes;
  cuda::Graph first, second, separate;
  Tensor a, b, c;
  {
    cuda::GraphCapture capture(first);
    a = (x * 2).sum();  // the 1 MiB temporary is freed inside the capture
  }
  const int64_t after_first = cuda::memory_stats().graph_pool_bytes;
  EXPECT_GT(after_first, before);
  {
    cuda::GraphCapture capture(second, first.pool());
    b = (x * 3).sum();  // reuses the first graph's freed temporary
  }
  EXPECT_EQ(cuda::memory_stats().graph_pool_bytes, after_first);
  {
    cuda::GraphCapture capture(separate);
    c = (x * 4).sum();  // a pool of its own
  }
  EXPECT_GT(cuda::memory_stats().graph_pool_bytes, after_first);
  first.replay();
  second.replay();  // in capture order
  separate.replay();
  EXPECT_EQ(a.item<float>(), 2.0f * n);
  EXPECT_EQ(b.item<float>(), 3.0f * n);
  EXPECT_EQ(c.item<float>(), 4.0f * n);
}

TEST(CudaGraph, ResetGivesThePoolBackToTheAllocator) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;  // 4 MiB of float32
  Tensor x = ones({n}, TensorOptions(kFloat32, Device::cuda()));
  const cuda::Stream stream = cuda::Stream::create();
  cuda::empty_cache();  // no ordinary cached block competes with the graph's below
  const int64_t pool_before = cuda::memory_stats().graph_pool_bytes;
  void* temporary = nullptr;
  {
    cuda::Graph graph;
    {
      cuda::GraphCapture capture(graph, {}, stream);
      Tensor doubled = x * 2;
      temporary = doubled.data();
      (void)doubled.sum();  // nothing outlives the capture but the graph's hold on its pool
    }
    EXPECT_GT(cuda::memory_stats().graph_pool_bytes, pool_before);
    graph.replay();
    graph.reset();
    EXPECT_EQ(cuda::memory_stats().graph_pool_bytes, pool_before);
  }
  // the former graph memory is cached for ordinary allocations on that stream: reused, no cudaMalloc
  const int64_t raw_allocs = cuda::memory_stats().num_raw_allocs;
  cuda::StreamGuard guard(stream);
  Tensor again = x * 2;
  EXPECT_EQ(again.data(), temporary);
  EXPECT_EQ(cuda::memory_stats().num_raw_allocs, raw_allocs);
  cuda_testing::expect_close(full({n}, 2.0f), again, "eager after reset", 0);
}
