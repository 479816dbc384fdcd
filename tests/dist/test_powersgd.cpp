// powerSGD_hook under mpirun, against a float64 reference written here with plain loops from
// every rank's local gradients (gathered): P = M Q, summed, orthonormalized, Q = M^T P averaged,
// M' = P Q^T; error feedback; the warm-up; full rank; resuming from a state_dict; training.
#include "dist/comm_hook_testing.h"

namespace strata {
namespace {

using comm_hook_testing::backward;
using comm_hook_testing::coefficients;
using comm_hook_testing::gather_all;
using comm_hook_testing::grads;
using comm_hook_testing::kBucketCapMb;
using comm_hook_testing::Weights;
namespace hooks = dist::ddp_comm_hooks;

// A row-major float64 matrix for the reference.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  Mat(const Tensor& t, int64_t r, int64_t c) : Mat(r, c) {
    Tensor h = t.contiguous();
    std::copy_n(h.data_ptr<double>(), r * c, v.begin());
  }
  double& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * cols + j)]; }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
};
Mat mul(const Mat& a, const Mat& b, bool transpose_a = false, bool transpose_b = false) {
  const int64_t n = transpose_a ? a.cols : a.rows, k = transpose_a ? a.rows : a.cols;
  const int64_t m = transpose_b ? b.rows : b.cols;
  Mat out(n, m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t l = 0; l < k; ++l)
        out.at(i, j) += (transpose_a ? a.at(l, i) : a.at(i, l)) * (transpose_b ? b.at(j, l) : b.at(l, j));
  return out;
}
void gram_schmidt(Mat& m) {
  for (int64_t i = 0; i < m.cols; ++i) {
    double length = 0;
    for (int64_t row = 0; row < m.rows; ++row) length += m.at(row, i) * m.at(row, i);
    for (int64_t row = 0; row < m.rows; ++row) m.at(row, i) /= std::sqrt(length);
    for (int64_t j = i + 1; j < m.cols; ++j) {
      double dot = 0;
      for (int64_t row = 0; row < m.rows; ++row) dot += m.at(row, i) * m.at(row, j);
      for (int64_t row = 0; row < m.rows; ++row) m.at(row, j) -= dot * m.at(row, i);
    }
  }
}
Tensor to_tensor(const Mat& m, const Shape& shape) { return from_vector(m.v).view(shape); }

// How PowerSGD sees parameter p: an n x m matrix of rank r, compressed or not (torch's rule).
struct Layout {
  int64_t n, m, r;
  bool compressed;
};
Layout layout_of(const Tensor& p, int64_t rank, double min_compression_rate) {
  const int64_t n = p.size(0), m = p.numel() / n, r = std::min({n, m, rank});
  return {n, m, r, static_cast<double>((n + m) * r) * min_compression_rate < static_cast<double>(n * m)};
}

TEST(PowerSGD, WarmUpIsThePlainAverageAndCountsSynchronizedPassesOnly) {
  auto pg = dist_testing::group();
  const int r = pg->rank();
  Weights net(4), ref(4);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb}), plain(ref, {.bucket_cap_mb = kBucketCapMb});
  auto state = std::make_shared<hooks::PowerSGDState>(nullptr, hooks::PowerSGDOptions{.start_powerSGD_iter = 2});
  ddp.register_comm_hook(state, hooks::powerSGD_hook);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    if (step == 1) {  // a no_sync pass accumulates and does not count
      auto g1 = ddp.no_sync();
      auto g2 = plain.no_sync();
      backward(ddp, net, r, 50);
      backward(plain, ref, r, 50);
    }
    EXPECT_EQ(state->iter, step);
    backward(ddp, net, r, step);
    backward(plain, ref, r, step);
    const auto got = grads(net), want = grads(ref);
    bool all_equal = true;
    for (size_t k = 0; k < got.size(); ++k) all_equal = all_equal && equal(got[k], want[k]);
    EXPECT_EQ(all_equal, step < 2);  // from iter 2 on the matrices are compressed
    EXPECT_EQ(state->error_dict.size(), step < 2 ? 0u : 3u);
    net.zero_grad();
    ref.zero_grad();
  }
  EXPECT_EQ(state->iter, 3);
  EXPECT_GT(state->compression_rate(), 1.0);
}

// The rank-r reduction every rank gets equals the float64 reference, step after step, with
// error feedback (the residual accumulated exactly: bit for bit) and warm start (each step's Q
// is the state's Q of the step before, orthonormalized). The first compressed step starts from
// random Qs: there the check is that the result is P Q^T with orthonormal P from the state.
void check_against_reference(int64_t rank, double min_compression_rate) {
  auto pg = dist_testing::group();
  const int me = pg->rank(), n_ranks = pg->size();
  Weights net(11);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  auto state = std::make_shared<hooks::PowerSGDState>(
      nullptr, hooks::PowerSGDOptions{.matrix_approximation_rank = rank, .start_powerSGD_iter = 1,
                                      .min_compression_rate = min_compression_rate});
  ddp.register_comm_hook(state, hooks::powerSGD_hook);
  const std::vector<Tensor> params = net.parameters();
  const auto buckets = ddp.bucket_assignment();
  std::vector<std::vector<Tensor>> error(static_cast<size_t>(n_ranks));  // per rank, per parameter
  for (auto& e : error)
    for (const Tensor& p : params) e.push_back(zeros_like(p.detach()));
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    std::map<size_t, Tensor> q_before;
    for (const auto& [b, q] : state->q_memory_dict) q_before[b] = q.clone();
    const std::vector<Tensor> local = coefficients(net, me, step);
    std::vector<std::vector<Tensor>> m(static_cast<size_t>(n_ranks));  // every rank's M = g + e
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<Tensor> all = gather_all(*pg, local[k]);
      for (int q = 0; q < n_ranks; ++q) m[q].push_back(step == 0 ? all[q] : all[q] + error[q][k]);
    }
    backward(ddp, net, me, step);
    const std::vector<Tensor> got = grads(net);
    net.zero_grad();
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t offset = 0, q_at = 0, p_at = 0;
      for (size_t k : buckets[b]) {
        SCOPED_TRACE(fmt::format("param {}", k));
        const Layout l = layout_of(params[k], rank, min_compression_rate);
        Tensor avg = zeros_like(got[k]);
        for (int q = 0; q < n_ranks; ++q) avg = avg + m[q][k];
        avg = avg / static_cast<double>(n_ranks);
        if (step == 0 || !l.compressed) {
          EXPECT_TRUE(allclose(got[k], avg, 1e-13, 1e-14));
        } else if (!q_before.count(b)) {  // first compressed step: random Q
          Mat p(state->p_memory_dict.at(b).narrow(0, p_at, l.n * l.r), l.n, l.r);
          Mat qm(state->q_memory_dict.at(b).narrow(0, q_at, l.m * l.r), l.m, l.r);
          EXPECT_TRUE(allclose(to_tensor(mul(p, p, true), {l.r, l.r}), eye(l.r, std::nullopt, kFloat64), 1e-12, 1e-12));
          EXPECT_TRUE(allclose(got[k], to_tensor(mul(p, qm, false, true), params[k].shape()), 1e-12, 1e-12));
        } else {
          Mat q0(q_before.at(b).narrow(0, q_at, l.m * l.r), l.m, l.r);
          gram_schmidt(q0);
          Mat p(l.n, l.r), qm(l.m, l.r);
          for (int q = 0; q < n_ranks; ++q) {
            Mat pq = mul(Mat(m[q][k], l.n, l.m), q0);
            for (size_t i = 0; i < p.v.size(); ++i) p.v[i] += pq.v[i];
          }
          gram_schmidt(p);
          for (int q = 0; q < n_ranks; ++q) {
            Mat qq = mul(Mat(m[q][k], l.n, l.m), p, true);
            for (size_t i = 0; i < qm.v.size(); ++i) qm.v[i] += qq.v[i] / n_ranks;
          }
          EXPECT_TRUE(allclose(got[k], to_tensor(mul(p, qm, false, true), params[k].shape()), 1e-10, 1e-12));
          EXPECT_TRUE(allclose(state->q_memory_dict.at(b).narrow(0, q_at, l.m * l.r), to_tensor(qm, {l.m * l.r}),
                               1e-10, 1e-12));
        }
        if (step > 0) {  // the new error: this rank's M minus what it got, exactly
          Tensor kept = state->error_dict.at(b).narrow(0, offset, params[k].numel()).view(params[k].shape());
          EXPECT_TRUE(equal(kept, m[me][k] - got[k]));
          for (int q = 0; q < n_ranks; ++q) error[q][k] = m[q][k] - got[k];
        }
        offset += params[k].numel();
        if (l.compressed) {
          p_at += l.n * l.r;
          q_at += l.m * l.r;
        }
      }
    }
  }
}

TEST(PowerSGD, RankOneMatchesTheFloat64Reference) { check_against_reference(1, 2); }
TEST(PowerSGD, RankTwoMatchesTheFloat64Reference) { check_against_reference(2, 1); }

// A rank as large as each matrix reduces exactly: the plain average of the gradients (error
// feedback's residuals are then only local minus average, which sum to zero over the ranks).
TEST(PowerSGD, FullRankGivesTheExactAverage) {
  auto pg = dist_testing::group();
  const int me = pg->rank(), n_ranks = pg->size();
  for (bool feedback_and_warm : {true, false}) {
    SCOPED_TRACE(feedback_and_warm ? "error feedback, warm start" : "neither");
    Weights net(12);
    dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
    auto state = std::make_shared<hooks::PowerSGDState>(
        nullptr, hooks::PowerSGDOptions{.matrix_approximation_rank = 8, .start_powerSGD_iter = 0,
                                        .min_compression_rate = 0, .use_error_feedback = feedback_and_warm,
                                        .warm_start = feedback_and_warm});
    ddp.register_comm_hook(state, hooks::powerSGD_hook);
    for (int step = 0; step < 3; ++step) {
      backward(ddp, net, me, step);
      const std::vector<Tensor> got = grads(net);
      net.zero_grad();
      for (size_t k = 0; k < got.size(); ++k) {
        Tensor avg = zeros_like(got[k]);
        for (int q = 0; q < n_ranks; ++q) avg = avg + coefficients(net, q, step)[k];
        EXPECT_TRUE(allclose(got[k], avg / static_cast<double>(n_ranks), 1e-10, 1e-12))
            << "step " << step << " param " << k;
      }
    }
    EXPECT_EQ(state->error_dict.size(), feedback_and_warm ? 3u : 0u);
    EXPECT_EQ(state->q_memory_dict.size(), feedback_and_warm ? 3u : 0u);
    // per step: w1 8x6 at r 6, w2 5x8 at 5, w3 3x8 at 3, b1 8x1 at 1, small 2x2 at 2: (n + m) r sent
    EXPECT_EQ(state->total_numel_before_compression, 3 * (48 + 40 + 24 + 8 + 4));
    EXPECT_EQ(state->total_numel_after_compression, 3 * (84 + 65 + 33 + 9 + 8));
    EXPECT_DOUBLE_EQ(state->compression_rate(), 124.0 / 199.0);
  }
}

// PowerSGD wrapped to work in bfloat16 (bf16_compress_wrapper): at full rank it still gives the
// average, to bfloat16's precision (the casts, the products and Gram-Schmidt in bfloat16).
TEST(PowerSGD, UnderTheBf16WrapperFullRankGivesTheAverageToBf16Precision) {
  auto pg = dist_testing::group();
  const int me = pg->rank(), n_ranks = pg->size();
  Weights net(13);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  auto state = std::make_shared<hooks::PowerSGDState>(
      nullptr, hooks::PowerSGDOptions{.matrix_approximation_rank = 8, .start_powerSGD_iter = 0,
                                      .min_compression_rate = 0, .use_error_feedback = false});
  ddp.register_comm_hook(state, hooks::bf16_compress_wrapper(hooks::powerSGD_hook));
  backward(ddp, net, me, 0);
  const std::vector<Tensor> got = grads(net);
  double worst = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    Tensor avg = zeros_like(got[k]);
    for (int q = 0; q < n_ranks; ++q) avg = avg + coefficients(net, q, 0)[k];
    avg = avg / static_cast<double>(n_ranks);
    worst = std::max(worst, (got[k] - avg).abs().max().item<double>() / avg.abs().max().item<double>());
  }
  std::printf("bf16-wrapped PowerSGD at full rank: worst error %.3g of the largest entry\n", worst);
  EXPECT_LT(worst, 0.05);
  EXPECT_EQ(state->q_memory_dict.at(0).dtype(), kBFloat16);
}

// A state saved after some steps and loaded into a fresh one (fresh model, fresh DDP) resumes
// bit for bit; a fresh state without it does not. A bad dict raises and changes nothing.
TEST(PowerSGD, StateDictResumesExactly) {
  auto pg = dist_testing::group();
  const int me = pg->rank();
  const hooks::PowerSGDOptions options{.matrix_approximation_rank = 2, .start_powerSGD_iter = 1,
                                       .min_compression_rate = 1};
  Weights net(21), resumed_net(21), fresh_net(21);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  auto state = std::make_shared<hooks::PowerSGDState>(nullptr, options);
  ddp.register_comm_hook(state, hooks::powerSGD_hook);
  for (int step = 0; step < 3; ++step) backward(ddp, net, me, step);
  const std::map<std::string, Tensor> saved = state->state_dict();
  EXPECT_EQ(saved.size(), 3u + 3u * 3u);  // iter, rng, compression_stats; error, p, q per bucket

  auto resumed = std::make_shared<hooks::PowerSGDState>(nullptr, options);
  auto bad = saved;
  bad.erase("iter");
  EXPECT_TRUE(testing::throws_with([&] { resumed->load_state_dict(bad); }, {"load_state_dict", "'iter' is missing"}));
  bad = saved;
  bad["error.x"] = zeros({2}, kFloat64);
  EXPECT_TRUE(testing::throws_with([&] { resumed->load_state_dict(bad); }, {"unknown key 'error.x'"}));
  EXPECT_EQ(resumed->iter, 0);
  EXPECT_TRUE(resumed->error_dict.empty());
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->iter, 3);

  dist::DistributedDataParallel resumed_ddp(resumed_net, {.bucket_cap_mb = kBucketCapMb});
  resumed_ddp.register_comm_hook(resumed, hooks::powerSGD_hook);
  dist::DistributedDataParallel fresh_ddp(fresh_net, {.bucket_cap_mb = kBucketCapMb});
  hooks::PowerSGDOptions at_once = options;
  at_once.start_powerSGD_iter = 0;
  fresh_ddp.register_comm_hook(std::make_shared<hooks::PowerSGDState>(nullptr, at_once), hooks::powerSGD_hook);
  net.zero_grad();
  backward(ddp, net, me, 3);
  backward(resumed_ddp, resumed_net, me, 3);
  backward(fresh_ddp, fresh_net, me, 3);
  const auto want = grads(net), got = grads(resumed_net), fresh = grads(fresh_net);
  bool fresh_differs = false;
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_TRUE(equal(got[k], want[k])) << "param " << k;
    fresh_differs = fresh_differs || !equal(fresh[k], want[k]);
  }
  EXPECT_TRUE(fresh_differs);
  for (const auto& [b, e] : state->error_dict) EXPECT_TRUE(equal(resumed->error_dict.at(b), e));
}

struct Mlp : nn::Module {
  nn::Linear fc1{12, 16}, fc2{16, 6};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return fc2(tanh(fc1(x))); }
};

// The loss over the whole data set before and after `steps` of SGD with DDP (each rank on its
// rows), with PowerSGD at rank 1 after 5 plain steps or without a hook.
std::pair<double, double> train(bool powersgd, int steps) {
  auto pg = dist_testing::group();
  const int me = pg->rank(), n_ranks = pg->size();
  manual_seed(31);
  Mlp net;
  net.to(kFloat64);
  dist::DistributedDataParallel ddp(net);
  if (powersgd)
    ddp.register_comm_hook(std::make_shared<hooks::PowerSGDState>(
                               nullptr, hooks::PowerSGDOptions{.start_powerSGD_iter = 5}),
                           hooks::powerSGD_hook);
  optim::SGD opt(net.parameters(), {.lr = 0.05, .momentum = 0.9});
  Generator gen(77);
  const Tensor x = randn({64, 12}, kFloat64, &gen), w = randn({12, 6}, kFloat64, &gen);
  const Tensor y = x.matmul(w) * 0.3;
  const int64_t rows = 64 / n_ranks;
  auto global_loss = [&] {
    NoGradGuard no_grad;
    return nn::functional::mse_loss(net(x), y).item<double>();
  };
  const double initial = global_loss();
  for (int step = 0; step < steps; ++step) {
    nn::functional::mse_loss(ddp(x.narrow(0, me * rows, rows)), y.narrow(0, me * rows, rows)).backward();
    opt.step();
    opt.zero_grad();
  }
  return {initial, global_loss()};
}

TEST(PowerSGD, TrainingConvergesAsThePlainAverageDoes) {
  const auto [initial, plain] = train(false, 150);
  const auto [initial2, compressed] = train(true, 150);
  EXPECT_EQ(initial, initial2);
  std::printf("loss %.4g -> plain %.4g, PowerSGD rank 1 %.4g\n", initial, plain, compressed);
  EXPECT_LT(plain, 0.05 * initial);
  EXPECT_LT(compressed, 0.05 * initial);
}

// A matrix whose gradient is zero on every rank: its normalized columns are 0/0 (NaN, as in
// torch) without orthogonalization_epsilon, and zeros with it.
TEST(PowerSGD, OrthogonalizationEpsilonKeepsAZeroGradientZero) {
  auto pg = dist_testing::group();
  for (double epsilon : {0.0, 1e-8}) {
    SCOPED_TRACE(fmt::format("epsilon {}", epsilon));
    Weights net(14);
    dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
    ddp.register_comm_hook(std::make_shared<hooks::PowerSGDState>(
                               nullptr, hooks::PowerSGDOptions{.start_powerSGD_iter = 0,
                                                               .orthogonalization_epsilon = epsilon}),
                           hooks::powerSGD_hook);
    std::vector<Tensor> c = coefficients(net, pg->rank(), 0);
    c[0] = zeros_like(c[0]);  // w1
    ddp.forward_with([&] { return net.loss(c); }).backward();
    if (epsilon == 0) EXPECT_TRUE(net.w1.grad().isnan().all().item<bool>());
    else EXPECT_TRUE(equal(net.w1.grad(), zeros_like(c[0])));
  }
}

TEST(PowerSGD, BadOptionsRaise) {
  using Options = hooks::PowerSGDOptions;
  auto make = [](Options o) { return [o] { hooks::PowerSGDState state(nullptr, o); }; };
  EXPECT_TRUE(testing::throws_with(make(Options{.matrix_approximation_rank = 0}), {"matrix_approximation_rank"}));
  EXPECT_TRUE(testing::throws_with(make(Options{.start_powerSGD_iter = -1}), {"start_powerSGD_iter"}));
  EXPECT_TRUE(testing::throws_with(make(Options{.min_compression_rate = -1}), {"min_compression_rate"}));
  EXPECT_TRUE(testing::throws_with(make(Options{.orthogonalization_epsilon = -1}), {"orthogonalization_epsilon"}));
}

}  // namespace
}  // namespace strata
