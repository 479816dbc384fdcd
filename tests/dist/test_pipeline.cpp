// GPipe under mpirun: one block per rank, micro-batches through send/recv; the loss, every
// stage's gradients and the parameters after SGD steps equal those of the whole chain of blocks
// trained in one process on the whole batch (float64), with 1 and 4 micro-batches.
#include "dist/dist_testing.h"

namespace strata {
namespace {

namespace F = nn::functional;

// Block k of the chain: Linear then tanh, except the last block, which is Linear alone.
struct Block : nn::Module {
  nn::Linear fc;
  bool last;
  Block(int k, int blocks, Generator* gen) : fc(k == 0 ? 5 : 7, k == blocks - 1 ? 3 : 7, {.generator = gen}),
                                             last(k == blocks - 1) {
    register_module("fc", fc);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return last ? fc(x) : tanh(fc(x)); }
};

TEST(GPipe, TrainsLikeTheWholeChainInOneProcess) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  for (int64_t chunks : {1, 4}) {
    SCOPED_TRACE(fmt::format("{} micro-batches", chunks));
    std::vector<std::unique_ptr<Block>> whole;
    for (int k = 0; k < n; ++k) {
      Generator gen(40 + static_cast<uint64_t>(k));
      whole.push_back(std::make_unique<Block>(k, n, &gen));
    }
    Generator gen(40 + static_cast<uint64_t>(r));
    Block mine(r, n, &gen);
    dist::GPipe pipe(mine, {.chunks = chunks});
    optim::SGD opt(mine.parameters(), {.lr = 0.1});
    std::vector<Tensor> whole_params;  // the reference trains the whole chain
    for (auto& b : whole)
      for (const Tensor& p : b->parameters()) whole_params.push_back(p);
    optim::SGD ref_opt(whole_params, {.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      Generator data(7 + static_cast<uint64_t>(step));
      Tensor x = randn({8, 5}, TensorOptions(kFloat64), &data), y = randn({8, 3}, TensorOptions(kFloat64), &data);
      auto mse = [](const Tensor& out, const Tensor& t) { return F::mse_loss(out, t); };
      // ranks other than the first and last pass nothing they do not need
      Tensor loss = pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), mse);
      Tensor h = x;
      for (auto& b : whole) h = (*b)(h);
      Tensor ref_loss = mse(h, y);
      ref_loss.backward();  // every rank trains the whole chain; only its own block is compared
      EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-12);
      auto got = mine.parameters(), want = whole[static_cast<size_t>(r)]->parameters();
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_TRUE(allclose(got[k].grad(), want[k].grad(), 1e-12, 1e-13)) << "gradient " << k;
      opt.step();
      ref_opt.step();
      for (auto& b : whole) b->zero_grad();
      opt.zero_grad();
      for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(allclose(got[k], want[k], 1e-12, 1e-13)) << "param " << k;
    }
    // the forward alone gives the chain's output on the last rank
    Generator data(3);
    Tensor x = randn({8, 5}, TensorOptions(kFloat64), &data);
    Tensor out = pipe.forward(x);
    if (pipe.is_last()) {
      NoGradGuard no_grad;
      Tensor h = x;
      for (auto& b : whole) h = (*b)(h);
      EXPECT_TRUE(allclose(out, h, 1e-12, 1e-13));
    } else {
      EXPECT_FALSE(out.defined());
    }
  }
}

TEST(GPipe, BadBatchesRaise) {
  auto pg = dist_testing::group();
  nn::Linear stage(2, 2);
  EXPECT_TRUE(testing::throws_with([&] { dist::GPipe(stage, {.chunks = 0}); }, {"chunks"}));
  if (pg->size() > 1) return;  // a split that raises on one rank alone would leave the others waiting
  dist::GPipe pipe(stage, {.chunks = 3});
  EXPECT_TRUE(testing::throws_with([&] { pipe.train_step(zeros({4, 2}), zeros({4, 2}), nullptr); },
                                   {"does not split into 3"}));
}

}  // namespace
}  // namespace strata
