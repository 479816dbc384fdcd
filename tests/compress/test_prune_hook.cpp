// The forward pre-hook of pruning (Note [Keeping pruned weights zero]): AdamW after pruning
// revives pruned weights, and every forward still computes with weight * mask (checked against a
// float64 forward written out here and by a hook that reads the weights forward sees); one hook
// per module, dropped by remove; loaded weights and masks, moves and gradient accumulation.
#include <algorithm>
#include <cmath>
#include <set>

#include "compress/prune_testing.h"
#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::values;
using strata::testing::zero_positions;

namespace {

// y = x W^T + b in float64, W (out, in) row-major, x (n, in).
std::vector<double> linear64(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                             int64_t in) {
  const int64_t out = static_cast<int64_t>(b.size()), n = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(static_cast<size_t>(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

}  // namespace

TEST(PruneHook, AdamWRevivesPrunedWeightsAndEveryForwardZeroesThem) {
  Generator g(5);
  nn::Sequential net(nn::Linear(6, 8, {.generator = &g}), nn::ReLU(), nn::Linear(8, 2, {.generator = &g}));
  optim::AdamW opt(net.parameters(), {.lr = 0.05, .weight_decay = 0.1});
  const Tensor x = randn({16, 6}, kFloat32, &g), y = randn({16, 2}, kFloat32, &g);
  const std::vector<double> xv = values(x);
  auto& fc1 = *net.named_modules()[1].second;
  auto& fc2 = *net.named_modules()[3].second;
  const Tensor w1 = net.parameters()[0], b1 = net.parameters()[1], w2 = net.parameters()[2], b2 = net.parameters()[3];
  auto step = [&] {
    opt.zero_grad();
    nn::functional::mse_loss(net(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();  // Adam's moments are nonzero everywhere now
  compress::ln_structured(fc1, "weight", 3, 1, 0);
  compress::l1_unstructured(fc1, "weight", 0.25);  // the same parameter again: one combined mask
  compress::l1_unstructured(fc2, "weight", 5);
  const std::vector<double> mask1 = values(fc1.state_dict().at("weight_mask"));
  const std::vector<double> mask2 = values(fc2.state_dict().at("weight_mask"));
  const std::set<int64_t> pruned1 = zero_positions(fc1.state_dict().at("weight_mask"));
  ASSERT_EQ(pruned1.size(), 3u * 6 + 8);
  int forwards_seen = 0;
  fc1.register_forward_pre_hook([&](nn::Module&, const Tensor&) {  // after pruning's: sees what forward reads
    ++forwards_seen;
    const auto w = values(w1);
    for (int64_t p : pruned1) ASSERT_EQ(w[p], 0.0) << "entry " << p;
  });

  int revived_steps = 0;
  for (int i = 0; i < 6; ++i) {
    step();  // no reapply_masks: the moments move pruned weights off zero in the stored parameter
    const std::vector<double> stored = values(w1);
    revived_steps += std::any_of(pruned1.begin(), pruned1.end(), [&](int64_t p) { return stored[p] != 0; });
    std::vector<double> w1m = stored, w2m = values(w2);
    for (size_t k = 0; k < w1m.size(); ++k) w1m[k] *= mask1[k];
    for (size_t k = 0; k < w2m.size(); ++k) w2m[k] *= mask2[k];
    std::vector<double> h = linear64(xv, w1m, values(b1), 6);
    for (double& v : h) v = std::max(v, 0.0);
    const std::vector<double> want = linear64(h, w2m, values(b2), 8);
    ASSERT_TRUE(all_close(net(x), want, 1e-5, 1e-5)) << "after step " << i;
    for (int64_t p : pruned1) ASSERT_EQ(values(w1)[p], 0.0);
  }
  EXPECT_EQ(revived_steps, 6);  // the revival the hook undoes is real
  EXPECT_EQ(forwards_seen, 2 * 6);  // each step's forward and the checked one
  // the gradients stay masked
  opt.zero_grad();
  nn::functional::mse_loss(net(x), y).backward();
  const auto grad1 = values(w1.grad());
  for (int64_t p : pruned1) EXPECT_EQ(grad1[p], 0.0);
  // reapply_masks zeroes a revived parameter before any forward (as before saving)
  opt.step();
  compress::reapply_masks(net);
  for (int64_t p : pruned1) EXPECT_EQ(values(w1)[p], 0.0);
  const auto report = compress::sparsity_report(net);
  ASSERT_EQ(report.entries.size(), 2u);
  EXPECT_EQ(report.entries[0].name, "0.weight");
  EXPECT_EQ(report.entries[1].name, "2.weight");
  EXPECT_EQ(report.entries[0].zeros, static_cast<int64_t>(pruned1.size()));
  EXPECT_EQ(report.total.numel, 48 + 16);
  EXPECT_NE(report.to_string().find("0.weight"), std::string::npos);
  EXPECT_EQ(compress::sparsity_report(net, false).total.numel, net.num_parameters());
}

TEST(PruneHook, OneHookPerModuleThatRemoveDrops) {
  Generator g(1);
  nn::Linear fc(4, 3, {.generator = &g});
  EXPECT_FALSE(fc.has_hooks());
  nn::RemovableHandle first = fc.register_forward_pre_hook([](nn::Module&, const Tensor&) {});
  compress::l1_unstructured(fc, "weight", 4);
  compress::l1_unstructured(fc, "bias", 1);
  compress::l1_unstructured(fc, "weight", 2);
  // ids count registrations: pruning three times added one hook
  nn::RemovableHandle next = fc.register_forward_pre_hook([](nn::Module&, const Tensor&) {});
  EXPECT_EQ(next.id(), first.id() + 2);
  first.remove();
  next.remove();
  EXPECT_TRUE(fc.has_hooks());
  compress::remove(fc, "weight");
  EXPECT_TRUE(fc.has_hooks());  // the bias is still pruned
  compress::remove(fc, "bias");
  EXPECT_FALSE(fc.has_hooks());
  const std::set<int64_t> zeros = zero_positions(fc.weight);
  {
    NoGradGuard no_grad;
    fc.weight.fill_(1.0);  // after remove nothing masks the weight any more
  }
  fc(ones({1, 4}));
  EXPECT_TRUE(zero_positions(fc.weight).empty());
  // pruning after remove registers a hook again
  compress::l1_unstructured(fc, "weight", 2);
  {
    NoGradGuard no_grad;
    fc.weight.fill_(1.0);
  }
  fc(ones({1, 4}));
  EXPECT_EQ(zero_positions(fc.weight).size(), 2u);
  EXPECT_EQ(zeros.size(), 6u);
}

TEST(PruneHook, LoadedWeightsAreMaskedByTheNextForward) {
  Generator g(8);
  nn::Linear pruned(4, 3, {.generator = &g}), fresh(4, 3, {.generator = &g});
  compress::l1_unstructured(pruned, "weight", 0.5);
  const std::set<int64_t> zeros = zero_positions(pruned.weight);
  nn::StateDict saved = pruned.state_dict();
  saved["weight"] = ones({3, 4});  // a checkpoint saved after a step, without reapply_masks
  compress::identity(fresh, "weight");
  fresh.load_state_dict(saved);
  EXPECT_TRUE(zero_positions(fresh.weight).empty());  // stored as loaded until a forward
  const Tensor out = fresh(ones({1, 4}));
  EXPECT_EQ(zero_positions(fresh.weight), zeros);
  const auto b = values(fresh.bias);
  // each output sums the kept ones of its row
  std::vector<double> want(3);
  for (int64_t o = 0; o < 3; ++o) {
    want[o] = b[o];
    for (int64_t i = 0; i < 4; ++i) want[o] += zeros.count(o * 4 + i) ? 0.0 : 1.0;
  }
  EXPECT_TRUE(all_close(out, want, 1e-6, 1e-6));
}

TEST(PruneHook, SurvivesMovesAndConversionsAndAllowsAccumulation) {
  Generator g(3);
  nn::Linear fc(5, 4, {.generator = &g});
  compress::l1_unstructured(fc, "weight", 8);
  const std::set<int64_t> zeros = zero_positions(fc.weight);
  nn::Sequential net(std::move(fc));  // the hook moves with the module
  net.to(kFloat64);                   // new storages: the next forward masks them
  const Tensor w = net.parameters()[0];
  {
    NoGradGuard no_grad;
    w.fill_(2.0);
  }
  const Tensor x = randn({3, 5}, kFloat64, &g).requires_grad_();  // so the graphs save the weight
  // two forwards and one backward through both (gradient accumulation): the second forward
  // writes nothing, as nothing changed since the first, so the first graph's saved weight is intact
  const Tensor l1 = net(x).sum(), l2 = net(x).pow(2).sum();
  EXPECT_EQ(zero_positions(w), zeros);
  (l1 + l2).backward();
  for (int64_t p : zeros) EXPECT_EQ(values(w.grad())[p], 0.0);
}

TEST(PruneHook, ANewMaskValueAppliesAtTheNextForward) {
  Generator g(4);
  nn::Linear fc(3, 2, {.generator = &g});
  compress::identity(fc, "weight");  // prunes nothing
  fc(ones({1, 3}));
  EXPECT_TRUE(zero_positions(fc.weight).empty());
  // only the mask changes (as a loaded checkpoint's would): the weight is masked at the next forward
  fc.load_state_dict({{"weight_mask", from_vector<float>({1, 0, 1, 1, 1, 0}, Shape{2, 3})}}, false);
  fc(ones({1, 3}));
  EXPECT_EQ(zero_positions(fc.weight), (std::set<int64_t>{1, 5}));
}

TEST(PruneHook, AParameterGivenANewTensorIsMaskedEvenWhenTheVersionsAgree) {
  // set_data (as Module::to and shrinking use) gives the parameter another storage, whose version
  // counter may read what the hook recorded for the old one: the hook compares the storage too
  Generator g(6);
  nn::Linear fc(4, 3, {.generator = &g});
  compress::l1_unstructured(fc, "weight", 6);
  const std::set<int64_t> zeros = zero_positions(fc.weight);
  fc(ones({1, 4}));
  const Tensor fresh = ones({3, 4});
  {
    NoGradGuard no_grad;
    while (fresh.version() < fc.weight.version()) fresh.mul_(1.0);
  }
  ASSERT_EQ(fresh.version(), fc.weight.version());
  fc.weight.set_data(fresh);
  fc(ones({1, 4}));
  EXPECT_EQ(zero_positions(fc.weight), zeros);
}

TEST(PruneHook, TiedWeightsPrunedInTwoModulesAllowAccumulation) {
  // one storage pruned by two modules' hooks (tied weights): after an optimizer step each hook
  // multiplies once, and neither takes the other's multiplication, which cannot undo its mask,
  // for a change, so a second forward before the backward writes nothing the first graph saved
  Generator g(7);
  nn::Linear a(4, 4, {.generator = &g}), b(4, 4, {.generator = &g});
  b.weight.set_data(a.weight);
  compress::l1_unstructured(a, "weight", 3);
  compress::l1_unstructured(b, "weight", 5);
  const std::set<int64_t> zeros = zero_positions(a.weight);
  optim::SGD opt({a.weight}, {.lr = 0.1, .momentum = 0.9});
  const Tensor x = randn({2, 4}, kFloat32, &g).requires_grad_();
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    opt.zero_grad();
    const Tensor l1 = b(a(x)).sum(), l2 = b(a(x)).pow(2).sum();
    EXPECT_EQ(zero_positions(a.weight), zeros);  // both masks applied
    ASSERT_NO_THROW((l1 + l2).backward());
    opt.step();
    {
      NoGradGuard no_grad;  // revive every entry, as decay or a momentum from before pruning would
      a.weight.add_(1.0);
    }
  }
  // once b's pruning is removed, a's hook applies a's mask alone
  compress::remove(b, "weight");
  {
    NoGradGuard no_grad;
    a.weight.add_(1.0);
  }
  a(x);
  EXPECT_EQ(zero_positions(a.weight), zero_positions(a.state_dict().at("weight_mask")));
  EXPECT_LT(zero_positions(a.weight).size(), zeros.size());
}

TEST(PruneHook, AttentionInsideAnEncoderLayerKeepsItsMasksWithoutReapply) {
  // the layer calls self_attn(x, x, x, ...), a multi-input call that runs the pruning pre-hook
  Generator g(9);
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0, .generator = &g});
  optim::AdamW opt(layer.parameters(), {.lr = 0.05});
  const Tensor x = randn({5, 3, 8}, kFloat32, &g), y = randn({5, 3, 8}, kFloat32, &g);
  auto step = [&] {
    opt.zero_grad();
    nn::functional::mse_loss(layer(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();  // Adam's moments are nonzero everywhere now
  compress::mask_heads(layer.self_attn, {0});
  const Tensor w = layer.self_attn.in_proj_weight;
  const std::set<int64_t> pruned = zero_positions(layer.self_attn.state_dict().at("in_proj_weight_mask"));
  ASSERT_EQ(pruned.size(), 3u * 4 * 8);  // head 1's rows of the query, key and value projections
  int forwards_seen = 0;
  layer.self_attn.register_forward_pre_hook([&](nn::Module&, const std::vector<Tensor>& in) {
    ++forwards_seen;  // after pruning's hook: sees the weights forward reads
    EXPECT_EQ(in.size(), 5u);
    const auto stored = values(w);
    for (int64_t p : pruned) ASSERT_EQ(stored[p], 0.0) << "entry " << p;
  });
  int revived_steps = 0;
  for (int i = 0; i < 4; ++i) {
    step();  // no reapply_masks
    const std::vector<double> stored = values(w);
    revived_steps += std::any_of(pruned.begin(), pruned.end(), [&](int64_t p) { return stored[p] != 0; });
    layer(x);
    const std::vector<double> after = values(w);
    for (int64_t p : pruned) ASSERT_EQ(after[p], 0.0) << "entry " << p << " after step " << i;
  }
  EXPECT_EQ(revived_steps, 4);  // the revival the hook undoes is real
  EXPECT_EQ(forwards_seen, 2 * 4);
}
