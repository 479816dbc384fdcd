// Autocast: the dtype every op of the policy table gives inside and outside a region, regions
// (nesting, disabled, per thread, per device type), inputs it must leave alone, the casts seen
// by autograd (float32 gradients for float32 parameters, matching a float64 reference), the
// parameter cast cache, and ops built of other covered ops casting once.
#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

#include "testing.h"

using namespace strata;
namespace F = strata::nn::functional;
using strata::testing::values;

namespace {

Tensor rnd(const Shape& s, DType t = kFloat32, uint64_t seed = 1) {
  Generator g(seed);
  return randn(s, kFloat32, &g).to(t);
}

struct OpCase {
  std::string name;
  bool lower;  // LowerPrecision (else Float32)
  std::function<Tensor(DType)> run;  // the op on float inputs of the given dtype
};

std::vector<OpCase> op_cases() {
  const Tensor idx = full({4}, 1, kInt64);
  auto pos = [](DType t) { return (rand({4, 5}) + 0.5).to(t); };
  auto unit = [](DType t) { return (rand({4, 5}) * 0.5).to(t); };
  auto y01 = [](DType t) { return rand({4, 5}).to(t); };
  auto sign = [](DType t) { return where(rand({4}) > 0.5, 1.0, -1.0).to(t); };
  return {
      {"matmul", true, [](DType t) { return matmul(rnd({2, 4, 3}, t), rnd({3, 5}, t)); }},
      {"mm", true, [](DType t) { return mm(rnd({4, 3}, t), rnd({3, 5}, t)); }},
      {"bmm", true, [](DType t) { return bmm(rnd({2, 4, 3}, t), rnd({2, 3, 5}, t)); }},
      {"linear", true, [](DType t) { return linear(rnd({4, 3}, t), rnd({5, 3}, t), rnd({5}, t)); }},
      {"linear_gelu", true, [](DType t) { return linear_gelu(rnd({4, 3}, t), rnd({5, 3}, t), rnd({5}, t)); }},
      {"einsum", true, [](DType t) { return einsum("bij,bjk->bik", {rnd({2, 4, 3}, t), rnd({2, 3, 5}, t)}); }},
      {"conv2d", true, [](DType t) { return F::conv2d(rnd({1, 2, 5, 5}, t), rnd({3, 2, 3, 3}, t), rnd({3}, t)); }},
      {"conv1d", true, [](DType t) { return F::conv1d(rnd({1, 2, 7}, t), rnd({3, 2, 3}, t), rnd({3}, t)); }},
      {"conv_transpose2d", true,
       [](DType t) { return F::conv_transpose2d(rnd({1, 2, 4, 4}, t), rnd({2, 3, 3, 3}, t), rnd({3}, t)); }},
      {"scaled_dot_product_attention", true,
       [](DType t) {
         return F::scaled_dot_product_attention(rnd({2, 4, 8}, t), rnd({2, 6, 8}, t), rnd({2, 6, 8}, t));
       }},
      {"scaled_dot_product_attention (mask)", true,
       [](DType t) {
         return F::scaled_dot_product_attention(rnd({2, 4, 8}, t), rnd({2, 6, 8}, t), rnd({2, 6, 8}, t),
                                                rnd({4, 6}, t));
       }},
      {"softmax", false, [](DType t) { return softmax(rnd({4, 5}, t), -1); }},
      {"log_softmax", false, [](DType t) { return log_softmax(rnd({4, 5}, t), -1); }},
      {"layer_norm", false, [](DType t) { return F::layer_norm(rnd({4, 5}, t), {5}, rnd({5}, t), rnd({5}, t)); }},
      {"rms_norm", false, [](DType t) { return F::rms_norm(rnd({4, 5}, t), {5}, rnd({5}, t)); }},
      {"group_norm", false, [](DType t) { return F::group_norm(rnd({2, 4, 3}, t), 2, rnd({4}, t), rnd({4}, t)); }},
      {"cross_entropy", false, [idx](DType t) { return F::cross_entropy(rnd({4, 5}, t), idx); }},
      {"nll_loss", false, [idx](DType t) { return F::nll_loss(rnd({4, 5}, t), idx); }},
      {"mse_loss", false, [](DType t) { return F::mse_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"l1_loss", false, [](DType t) { return F::l1_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"smooth_l1_loss", false, [](DType t) { return F::smooth_l1_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"huber_loss", false, [](DType t) { return F::huber_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"binary_cross_entropy_with_logits", false,
       [y01](DType t) { return F::binary_cross_entropy_with_logits(rnd({4, 5}, t), y01(t)); }},
      {"binary_cross_entropy", false, [y01](DType t) { return F::binary_cross_entropy(y01(t) * 0.9, y01(t)); }},
      {"kl_div", false, [y01](DType t) { return F::kl_div(log_softmax(rnd({4, 5}, t), -1), y01(t)); }},
      {"soft_margin_loss", false, [](DType t) { return F::soft_margin_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"margin_ranking_loss", false,
       [sign](DType t) { return F::margin_ranking_loss(rnd({4}, t), rnd({4}, t, 2), sign(t)); }},
      {"hinge_embedding_loss", false,
       [](DType t) { return F::hinge_embedding_loss(rnd({4, 5}, t), where(rand({4, 5}) > 0.5, 1.0, -1.0).to(t)); }},
      {"cosine_embedding_loss", false,
       [sign](DType t) { return F::cosine_embedding_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2), sign(t)); }},
      {"triplet_margin_loss", false,
       [](DType t) { return F::triplet_margin_loss(rnd({4, 5}, t), rnd({4, 5}, t, 2), rnd({4, 5}, t, 3)); }},
      {"poisson_nll_loss", false, [pos](DType t) { return F::poisson_nll_loss(rnd({4, 5}, t), pos(t)); }},
      {"cosine_similarity", false, [](DType t) { return F::cosine_similarity(rnd({4, 5}, t), rnd({4, 5}, t, 2)); }},
      {"softplus", false, [](DType t) { return F::softplus(rnd({4, 5}, t)); }},
      {"exp", false, [](DType t) { return exp(rnd({4, 5}, t)); }},
      {"expm1", false, [](DType t) { return expm1(rnd({4, 5}, t)); }},
      {"log", false, [pos](DType t) { return log(pos(t)); }},
      {"log2", false, [pos](DType t) { return log2(pos(t)); }},
      {"log10", false, [pos](DType t) { return log10(pos(t)); }},
      {"log1p", false, [pos](DType t) { return log1p(pos(t)); }},
      {"reciprocal", false, [pos](DType t) { return reciprocal(pos(t)); }},
      {"rsqrt", false, [pos](DType t) { return rsqrt(pos(t)); }},
      {"sinh", false, [](DType t) { return sinh(rnd({4, 5}, t)); }},
      {"cosh", false, [](DType t) { return cosh(rnd({4, 5}, t)); }},
      {"tan", false, [unit](DType t) { return tan(unit(t)); }},
      {"asin", false, [unit](DType t) { return asin(unit(t)); }},
      {"acos", false, [unit](DType t) { return acos(unit(t)); }},
      {"pow (scalar exponent)", false, [pos](DType t) { return pow(pos(t), 1.5); }},
      {"pow (tensor exponent)", false, [pos](DType t) { return pow(pos(t), pos(t)); }},
      {"sum", false, [](DType t) { return sum(rnd({4, 5}, t)); }},
      {"sum (dims)", false, [](DType t) { return sum(rnd({4, 5}, t), {1}); }},
      {"prod", false, [](DType t) { return prod(rnd({4, 5}, t)); }},
      {"prod (dims)", false, [](DType t) { return prod(rnd({4, 5}, t), {1}); }},
      {"cumsum", false, [](DType t) { return cumsum(rnd({4, 5}, t), 1); }},
      {"cumprod", false, [](DType t) { return cumprod(rnd({4, 5}, t), 1); }},
      {"logsumexp", false, [](DType t) { return logsumexp(rnd({4, 5}, t), {1}); }},
      {"norm", false, [](DType t) { return norm(rnd({4, 5}, t)); }},
  };
}

}  // namespace

TEST(Autocast, EveryListedOpGivesItsPolicyDtype) {
  for (DType low : {kBFloat16, kFloat16}) {
    for (const OpCase& c : op_cases()) {
      SCOPED_TRACE(c.name + " under " + std::string(dtype_name(low)));
      // outside a region, ops keep their inputs' dtype
      EXPECT_EQ(c.run(kFloat32).dtype(), kFloat32);
      EXPECT_EQ(c.run(low).dtype(), low);
      amp::AutocastGuard autocast(DeviceType::CPU, low);
      if (c.lower) {
        EXPECT_EQ(c.run(kFloat32).dtype(), low);  // float32 cast down
        EXPECT_EQ(c.run(low).dtype(), low);       // already low: untouched
      } else {
        EXPECT_EQ(c.run(low).dtype(), kFloat32);  // 16-bit cast up
        EXPECT_EQ(c.run(kFloat32).dtype(), kFloat32);
      }
      EXPECT_EQ(c.run(kFloat64).dtype(), kFloat64);  // float64 is never cast
    }
  }
}

TEST(Autocast, LowPrecisionOpsComputeOnTheCastInputs) {
  const Tensor a = rnd({6, 7}), b = rnd({7, 5}, kFloat32, 2);
  Tensor got;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    got = matmul(a, b);
  }
  // the reference: the product of the bfloat16-rounded inputs in float64, rounded to bfloat16
  const Tensor want = matmul(a.to(kBFloat16).to(kFloat64), b.to(kBFloat16).to(kFloat64)).to(kBFloat16);
  EXPECT_TRUE(strata::testing::all_close(got, values(want), 1e-2, 1e-2));
  // softmax of bfloat16 logits in float32 equals the float32 softmax of the same values
  const Tensor x = rnd({3, 9}).to(kBFloat16);
  Tensor s;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    s = softmax(x, -1);
  }
  EXPECT_EQ(values(s), values(softmax(x.to(kFloat32), -1)));
}

TEST(Autocast, OpsOutsideTheListsAreUntouched) {
  amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
  const Tensor f = rnd({4, 5}), h = rnd({4, 5}).to(kBFloat16);
  EXPECT_EQ(relu(f).dtype(), kFloat32);
  EXPECT_EQ(tanh(h).dtype(), kBFloat16);
  EXPECT_EQ(mean(h).dtype(), kBFloat16);
  EXPECT_EQ((f + h).dtype(), kFloat32);  // binary ops promote as usual
  EXPECT_EQ((h * h).dtype(), kBFloat16);
}

TEST(Autocast, IntegerAndFloat64InputsAreLeftAlone) {
  amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
  const Tensor i = full({3, 3}, 2, kInt64);
  EXPECT_EQ(matmul(i, i).dtype(), kInt64);
  EXPECT_EQ(sum(i).dtype(), kInt64);
  EXPECT_EQ(cumsum(full({4}, 1, kInt32), 0).dtype(), kInt64);
  const Tensor d = rnd({3, 3}, kFloat64);
  EXPECT_EQ(matmul(d, d).dtype(), kFloat64);
  EXPECT_EQ(exp(d).dtype(), kFloat64);
  // float64 beside float32: only the float32 operand is cast, then the op promotes
  EXPECT_EQ(matmul(d, rnd({3, 3})).dtype(), kFloat64);
}

TEST(Autocast, RegionsNestRestoreAndDisable) {
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(amp::autocast_dtype(DeviceType::CPU), kBFloat16);
  EXPECT_EQ(amp::autocast_dtype(DeviceType::CUDA), kFloat16);
  const Tensor a = rnd({3, 3});
  {
    amp::AutocastGuard outer(DeviceType::CPU, kBFloat16);
    EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CPU));
    EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CUDA));
    EXPECT_EQ(matmul(a, a).dtype(), kBFloat16);
    {
      amp::AutocastGuard inner(DeviceType::CPU, kFloat16);
      EXPECT_EQ(amp::autocast_dtype(DeviceType::CPU), kFloat16);
      EXPECT_EQ(matmul(a, a).dtype(), kFloat16);
      {
        amp::AutocastGuard off(DeviceType::CPU, false);
        EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
        EXPECT_EQ(matmul(a, a).dtype(), kFloat32);
        EXPECT_EQ(softmax(a.to(kBFloat16), 0).dtype(), kBFloat16);
      }
      EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CPU));
      EXPECT_EQ(matmul(a, a).dtype(), kFloat16);
    }
    EXPECT_EQ(amp::autocast_dtype(DeviceType::CPU), kBFloat16);
    EXPECT_EQ(matmul(a, a).dtype(), kBFloat16);
  }
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(matmul(a, a).dtype(), kFloat32);
}

TEST(Autocast, RegionForAnotherDeviceTypeLeavesCpuOpsAlone) {
  amp::AutocastGuard autocast(DeviceType::CUDA, kFloat16);
  EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA));
  const Tensor a = rnd({3, 3});
  EXPECT_EQ(matmul(a, a).dtype(), kFloat32);
}

TEST(Autocast, StateIsPerThread) {
  amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
  const Tensor a = rnd({3, 3});
  bool other_enabled = true;
  DType other_dtype = kFloat64;
  std::thread t([&] {
    other_enabled = amp::is_autocast_enabled(DeviceType::CPU);
    other_dtype = matmul(a, a).dtype();
  });
  t.join();
  EXPECT_FALSE(other_enabled);
  EXPECT_EQ(other_dtype, kFloat32);
  EXPECT_EQ(matmul(a, a).dtype(), kBFloat16);
}

TEST(Autocast, BadDtypeRaises) {
  EXPECT_TRUE(strata::testing::throws_with([] { amp::AutocastGuard g(DeviceType::CPU, kFloat32); },
                                           {"[autocast]", "float16 or bfloat16", "float32"}));
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
}

// y = linear(x, W, b) under bfloat16 autocast: W and b are float32 leaves, so their gradients
// arrive in float32, and match the float64 gradient of the same (bfloat16-rounded) problem.
TEST(Autocast, LinearGradientsReachFloat32ParametersInFloat32) {
  manual_seed(3);
  nn::Linear lin(16, 8);
  const Tensor x = rnd({5, 16}, kFloat32, 4);
  Tensor loss;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    Tensor y = lin(x);
    EXPECT_EQ(y.dtype(), kBFloat16);
    loss = F::mse_loss(y, zeros({5, 8}));
    EXPECT_EQ(loss.dtype(), kFloat32);
  }
  loss.backward();
  ASSERT_TRUE(lin.weight.grad().defined());
  EXPECT_EQ(lin.weight.grad().dtype(), kFloat32);
  EXPECT_EQ(lin.bias.grad().dtype(), kFloat32);
  // float64 reference on the bfloat16-rounded operands
  const Tensor w64 = lin.weight.detach().to(kBFloat16).to(kFloat64).requires_grad_();
  const Tensor b64 = lin.bias.detach().to(kBFloat16).to(kFloat64).requires_grad_();
  F::mse_loss(linear(x.to(kBFloat16).to(kFloat64), w64, b64), zeros({5, 8}, kFloat64)).backward();
  EXPECT_TRUE(strata::testing::all_close(lin.weight.grad(), values(w64.grad()), 2e-2, 1e-3));
  EXPECT_TRUE(strata::testing::all_close(lin.bias.grad(), values(b64.grad()), 2e-2, 1e-3));
}

TEST(Autocast, Conv2dGradientsReachFloat32ParametersInFloat32) {
  manual_seed(5);
  nn::Conv2d conv(3, 4, 3, {.padding = 1});
  const Tensor x = rnd({2, 3, 6, 6}, kFloat32, 6);
  Tensor loss;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    Tensor y = conv(x);
    EXPECT_EQ(y.dtype(), kBFloat16);
    loss = sum(y * y);
    EXPECT_EQ(loss.dtype(), kFloat32);
  }
  loss.backward();
  EXPECT_EQ(conv.weight.grad().dtype(), kFloat32);
  EXPECT_EQ(conv.bias.grad().dtype(), kFloat32);
  const Tensor w64 = conv.weight.detach().to(kBFloat16).to(kFloat64).requires_grad_();
  const Tensor b64 = conv.bias.detach().to(kBFloat16).to(kFloat64).requires_grad_();
  const Tensor y64 = F::conv2d(x.to(kBFloat16).to(kFloat64), w64, b64, {.padding = 1});
  sum(y64 * y64).backward();
  // y is rounded to bfloat16 before the square: a relative error of about 2^-8 per element
  const double scale = values(abs(w64.grad()).max())[0];
  EXPECT_TRUE(strata::testing::all_close(conv.weight.grad(), values(w64.grad()), 2e-2, 2e-2 * scale));
  EXPECT_TRUE(strata::testing::all_close(conv.bias.grad(), values(b64.grad()), 2e-2, 2e-2 * scale));
}

TEST(Autocast, AParameterUsedTwiceInARegionIsCastOnce) {
  nn::Linear lin(4, 4, {.bias = false});
  const Tensor x = rnd({2, 4});
  amp::detail::reset_cast_count();
  Tensor y1, y2;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    y1 = lin(x);
    y2 = lin(y1);  // y1 is already bfloat16: only the weight could be cast, and it is cached
    EXPECT_EQ(amp::detail::cast_cache_size(), 1u);
    // x cast twice (not a parameter), the weight once
    EXPECT_EQ(amp::detail::cast_count(), 2);
    // both linear nodes take the weight's gradient from one cast node
    auto w_edge = [](const Tensor& y) { return y.grad_fn()->next_edges.at(1).node; };
    ASSERT_TRUE(w_edge(y1) && w_edge(y2));
    EXPECT_EQ(w_edge(y1), w_edge(y2));
    // a write in place makes the cached cast stale
    {
      NoGradGuard no_grad;
      lin.weight.mul_(2.0);
    }
    lin(y1);
    EXPECT_EQ(amp::detail::cast_count(), 3);
  }
  EXPECT_EQ(amp::detail::cast_cache_size(), 0u);  // emptied when the outermost region ends
  sum(y2.to(kFloat32)).backward();
  EXPECT_EQ(lin.weight.grad().dtype(), kFloat32);
  // the next region casts again
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    lin(x);
  }
  EXPECT_EQ(amp::detail::cast_count(), 5);
}

TEST(Autocast, NestedCoveredOpsCastOnce) {
  // linear runs matmul inside; attention runs matmul and softmax (a float32 op) inside: each
  // casts its inputs once, and the inner ops neither cast again nor flip dtypes back
  const Tensor x = rnd({3, 4}), w = rnd({5, 4}), b = rnd({5});
  amp::detail::reset_cast_count();
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    EXPECT_EQ(linear(x, w, b).dtype(), kBFloat16);
    EXPECT_EQ(amp::detail::cast_count(), 3);
    amp::detail::reset_cast_count();
    const Tensor q = rnd({2, 4, 8}), k = rnd({2, 6, 8}), v = rnd({2, 6, 8});
    const Tensor out = F::scaled_dot_product_attention(q, k, v, rnd({4, 6}));
    EXPECT_EQ(out.dtype(), kBFloat16);
    EXPECT_EQ(amp::detail::cast_count(), 4);  // q, k, v and the float mask
    // a float32 loss composed of covered ops (cross entropy over log_softmax and sums)
    amp::detail::reset_cast_count();
    F::cross_entropy(rnd({4, 5}).to(kBFloat16), full({4}, 2, kInt64), {.label_smoothing = 0.1});
    EXPECT_EQ(amp::detail::cast_count(), 1);
  }
}

TEST(Autocast, GradientsThroughAttentionArriveInFloat32) {
  const Tensor q = rnd({2, 4, 8}).requires_grad_(), k = rnd({2, 6, 8}, kFloat32, 2).requires_grad_();
  const Tensor v = rnd({2, 6, 8}, kFloat32, 3).requires_grad_();
  Tensor loss;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    loss = sum(F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true));
  }
  loss.backward();
  for (const Tensor* t : {&q, &k, &v}) EXPECT_EQ(t->grad().dtype(), kFloat32);
}

// Layers and ops outside the lists, many composed of listed ones, run in a region on float32 and
// bfloat16 inputs and give finite results and float32 parameter gradients.
TEST(Autocast, UnlistedLayersAndComposedOpsRunInRegions) {
  manual_seed(9);
  nn::LSTM lstm(6, 8);
  nn::GRU gru(6, 8);
  nn::MultiheadAttention mha(8, 2);
  nn::TransformerEncoderLayer encoder(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .activation = "gelu"});
  nn::BatchNorm2d bn(3);
  nn::Embedding emb(10, 8);
  nn::LayerNorm ln(8);
  const std::vector<Tensor> params = [&] {
    std::vector<Tensor> all;
    for (nn::Module* m : std::vector<nn::Module*>{&lstm, &gru, &mha, &encoder, &bn, &emb, &ln})
      for (const Tensor& p : m->parameters()) all.push_back(p);
    return all;
  }();
  for (DType t : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor loss;
    {
      amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
      const Tensor seq = rnd({5, 2, 6}, t), x8 = rnd({5, 2, 8}, t), img = rnd({2, 3, 4, 4}, t);
      const Tensor v = rnd({4, 5}, t), pos = (rand({4, 5}) + 0.5).to(t);
      const std::vector<Tensor> outs = {
          lstm(seq), gru(seq), mha(x8), encoder(x8), bn(img), ln(emb(full({5, 2}, 3, kInt64)) + x8),
          F::gaussian_nll_loss(v, rnd({4, 5}, t, 2), pos), F::multilabel_soft_margin_loss(v, gt(pos, 1.0).to(t)),
          F::pairwise_distance(v, rnd({4, 5}, t, 3)), F::normalize(v), F::mish(v), F::elu(v), F::logsigmoid(v),
          F::glu(v.narrow(1, 0, 4)), var(v, {1}), F::gelu(v), F::dropout(v, 0.5), mean(v)};
      loss = zeros({});
      for (const Tensor& o : outs) {
        EXPECT_TRUE(is_floating(o.dtype()));
        EXPECT_TRUE(bool(isfinite(o).all().item<bool>()));
        loss = loss + sum(o.to(kFloat32));
      }
    }
    for (const Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    for (const Tensor& p : params)
      if (p.grad().defined()) EXPECT_EQ(p.grad().dtype(), kFloat32);
  }
}

// The training loop as the library's design map writes it, on the CPU: Autocast for every
// device type, GradScaler, AdamW with warmup. The loss falls, and the region sees bfloat16.
TEST(Autocast, TheDocumentedTrainingLoopTrains) {
  namespace st = strata;
  st::manual_seed(5);
  auto model = st::nn::Sequential(st::nn::Linear(784, 256), st::nn::ReLU(), st::nn::Linear(256, 10));
  st::optim::AdamW opt(model.parameters(), {.lr = 1e-3, .betas = {0.9, 0.999}, .weight_decay = 0.01});
  st::optim::LambdaLR sched(opt, [](int64_t step) { return std::min((step + 1) / 5.0, 1.0); });
  st::amp::GradScaler scaler;
  Generator g(6);
  const Tensor input = randn({32, 784}, kFloat32, &g), target = randint(0, 10, {32}, kInt64, &g);
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    st::Tensor loss, logits;
    {
      st::amp::Autocast ac(st::kBFloat16);
      EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CPU) && amp::is_autocast_enabled(DeviceType::CUDA));
      logits = model(input);
      loss = st::nn::functional::cross_entropy(logits, target);
    }
    EXPECT_EQ(logits.dtype(), kBFloat16);
    EXPECT_EQ(loss.dtype(), kFloat32);
    losses.push_back(loss.item<double>());
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    sched.step();
  }
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU) || amp::is_autocast_enabled(DeviceType::CUDA));
  EXPECT_LT(losses.back(), 0.5 * losses.front());
}
