// DTensor's unary, normalizing, reshaping and loss ops under mpirun -np 4: for every placement of
// the input (Shard of each dim, Replicate, Partial on each dim of a 2 x 2 mesh, and on 4 ranks
// with uneven and empty pieces), the global value equals the op on the whole float64 tensor and
// the input's gradient (of a loss summed over the output's pieces) equals its block of the
// whole op's gradient; the placements the rules promise (no gather where a shard can stay); bad
// arguments raising on every rank.
#include "dist/dtensor_testing.h"

namespace strata {
namespace {

using namespace dtensor_testing;
using dist::DTensor;
using dist::Partial;
using dist::Replicate;
using dist::Shard;
namespace F = nn::functional;

struct UnaryCase {
  std::string name;
  Shape shape;
  std::function<DTensor(const DTensor&)> op;
  std::function<Tensor(const Tensor&)> ref;
};

void check_unary(const dist::DeviceMesh& mesh, const UnaryCase& c) {
  const Tensor g = global_values(c.shape);
  Tensor r = g.clone().requires_grad_();
  Tensor want = c.ref(r);
  const Tensor w = global_values(want.shape(), 2.0);
  (want * w).sum().backward();
  for (const Placements& p : all_combinations(choices_for(c.shape), mesh.ndim())) {
    const std::string what = c.name + " " + text(p);
    DTensor x = make_dtensor(g, p, mesh, true);
    DTensor out = c.op(x);
    ASSERT_EQ(out.shape(), want.shape()) << what;
    EXPECT_TRUE(close(out.full_tensor().detach(), want.detach())) << what << " -> " << text(out.placements());
    backward_through_pieces(out, w);
    EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), p, mesh))) << what << " (grad)";
  }
}

std::vector<UnaryCase> unary_cases() {
  return {
      {"exp", {4, 5}, [](auto& x) { return dist::exp(x); }, [](auto& x) { return exp(x); }},
      {"tanh", {4, 5}, [](auto& x) { return dist::tanh(x); }, [](auto& x) { return tanh(x); }},
      {"neg", {4, 5}, [](auto& x) { return -x; }, [](auto& x) { return neg(x); }},
      {"mul", {4, 5}, [](auto& x) { return x * 2.5; }, [](auto& x) { return x * 2.5; }},
      {"div", {4, 5}, [](auto& x) { return x / -4.0; }, [](auto& x) { return x / -4.0; }},
      {"softmax 0", {4, 5}, [](auto& x) { return dist::softmax(x, 0); }, [](auto& x) { return softmax(x, 0); }},
      {"softmax -1", {4, 5}, [](auto& x) { return dist::softmax(x, -1); }, [](auto& x) { return softmax(x, 1); }},
      {"log_softmax 1", {3, 5}, [](auto& x) { return dist::log_softmax(x, 1); },
       [](auto& x) { return log_softmax(x, 1); }},
      {"mean all", {4, 5}, [](auto& x) { return dist::mean(x); }, [](auto& x) { return x.mean(); }},
      {"mean 0", {4, 5}, [](auto& x) { return dist::mean(x, {0}); }, [](auto& x) { return x.mean({0}); }},
      {"mean -1 keep", {3, 5}, [](auto& x) { return dist::mean(x, {-1}, true); },
       [](auto& x) { return x.mean({1}, true); }},
      {"unsqueeze 1", {4, 5}, [](auto& x) { return dist::unsqueeze(x, 1); }, [](auto& x) { return x.unsqueeze(1); }},
      {"unsqueeze -1", {4, 5}, [](auto& x) { return dist::unsqueeze(x, -1); },
       [](auto& x) { return x.unsqueeze(2); }},
      {"squeeze", {4, 1, 3}, [](auto& x) { return dist::squeeze(x); }, [](auto& x) { return x.squeeze(); }},
      {"squeeze 1", {4, 1, 3}, [](auto& x) { return dist::squeeze(x, 1); }, [](auto& x) { return x.squeeze(1); }},
      {"squeeze 0 (not 1)", {4, 1, 3}, [](auto& x) { return dist::squeeze(x, 0); },
       [](auto& x) { return x.squeeze(0); }},
      {"merge", {4, 6}, [](auto& x) { return dist::reshape(x, {24}); }, [](auto& x) { return x.reshape({24}); }},
      {"regroup", {4, 6}, [](auto& x) { return dist::view(x, {8, -1}); }, [](auto& x) { return x.reshape({8, 3}); }},
      {"split", {4, 6}, [](auto& x) { return dist::reshape(x, {2, 2, 2, 3}); },
       [](auto& x) { return x.reshape({2, 2, 2, 3}); }},
      {"split 3-d", {2, 4, 3}, [](auto& x) { return dist::reshape(x, {2, 2, 6}); },
       [](auto& x) { return x.reshape({2, 2, 6}); }},
  };
}

TEST(DTensorShapeOps, UnaryOpsEveryPlacementOnTwoByTwo) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  for (const UnaryCase& c : unary_cases()) check_unary(mesh, c);
}

TEST(DTensorShapeOps, UnaryOpsUnevenAndEmptyPiecesOnFourRanks) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  for (UnaryCase c : unary_cases()) {
    if (c.shape == Shape{4, 5}) c.shape = {3, 5};  // 1, 1, 1, 0 rows
    if (c.name == "merge" || c.name == "regroup" || c.name == "split") continue;  // sizes fixed to 4 x 6
    check_unary(mesh, c);
  }
  check_unary(mesh, {"reshape 5x3", {5, 3}, [](auto& x) { return dist::reshape(x, {3, 5}); },
                     [](auto& x) { return x.reshape({3, 5}); }});
  check_unary(mesh, {"reshape 8", {8}, [](auto& x) { return dist::reshape(x, {2, 4}); },
                     [](auto& x) { return x.reshape({2, 4}); }});
}

TEST(DTensorShapeOps, ReshapeKeepsShardsThatStayContiguous) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  auto placed = [&](const Shape& in, Placement p, const Shape& out) {
    return dist::reshape(dist::distribute_tensor(global_values(in), mesh, {p}), out).placements()[0];
  };
  EXPECT_EQ(placed({8, 3}, Shard(0), {24}), Shard(0));        // leading dim of a merge
  EXPECT_EQ(placed({8, 3}, Shard(1), {24}), Replicate());     // inner dim of a merge: gathered
  EXPECT_EQ(placed({8, 3}, Shard(0), {4, 2, 3}), Shard(0));   // split, 4 divides over 4 ranks
  EXPECT_EQ(placed({8, 3}, Shard(0), {2, 4, 3}), Replicate());  // 2 rows cannot cut over 4 ranks
  EXPECT_EQ(placed({6, 8}, Shard(1), {6, 4, 2}), Shard(1));
  EXPECT_EQ(placed({5, 3}, Shard(0), {15}), Replicate());     // uneven pieces are not one run
  EXPECT_EQ(placed({4, 3}, Shard(1), {4, 1, 3}), Shard(2));   // kept whole, moved
  EXPECT_EQ(placed({4, 1}, Shard(0), {4}), Shard(0));
  DTensor part = dist::DTensor::from_local(global_values({4, 3}) * 0.25, mesh, {Partial()});
  DTensor flat = dist::reshape(part, {12});
  EXPECT_EQ(flat.placements()[0], Partial());  // parts move as they are
  EXPECT_TRUE(close(flat.full_tensor(), global_values({12})));
  DTensor sharded = dist::distribute_tensor(global_values({4, 6}), mesh, {Shard(1)});
  EXPECT_EQ(dist::softmax(sharded, 0).placements()[0], Shard(1));  // another dim: no gather
  EXPECT_EQ(dist::softmax(sharded, 1).placements()[0], Replicate());
  EXPECT_EQ(dist::mean(sharded, {1}).placements()[0], Partial());
  // neg turns a max of parts into a min of their negations
  Tensor mine = global_values({3}) + static_cast<double>(mesh.get_local_rank());
  DTensor pmax = dist::DTensor::from_local(mine, mesh, {Partial(dist::ReduceOp::Max)});
  DTensor n = -pmax;
  EXPECT_EQ(n.placements()[0], Partial(dist::ReduceOp::Min));
  EXPECT_TRUE(close(n.full_tensor(), -(global_values({3}) + 3.0)));
  EXPECT_TRUE(close((pmax * 2.0).full_tensor(), (global_values({3}) + 3.0) * 2.0));
}

TEST(DTensorShapeOps, LayerNormEveryPlacementWithWeightAndBias) {
  for (const std::vector<int>& mesh_shape : {std::vector<int>{2, 2}, std::vector<int>{4}}) {
    dist_testing::group();
    auto mesh = dist::init_device_mesh("cpu", mesh_shape);
    for (const Shape& normalized : {Shape{6}, Shape{4, 6}}) {
      const Tensor g = global_values({3, 4, 6});
      const Tensor gw = global_values(normalized, 1.0), gb = global_values(normalized, 2.0);
      Tensor r = g.clone().requires_grad_(), rw = gw.clone().requires_grad_(), rb = gb.clone().requires_grad_();
      Tensor want = F::layer_norm(r, normalized, rw, rb, 1e-5);
      const Tensor w = global_values(want.shape(), 3.0);
      (want * w).sum().backward();
      const Placements param_choices{Replicate(), Shard(0), Partial()};
      for (const Placements& p : all_combinations(choices_for(g.shape()), mesh.ndim()))
        for (const Placements& pw : all_combinations(param_choices, mesh.ndim())) {
          const std::string what = std::to_string(normalized.size()) + " x " + text(p) + " w " + text(pw);
          DTensor x = make_dtensor(g, p, mesh, true), dw = make_dtensor(gw, pw, mesh, true);
          DTensor db = make_dtensor(gb, pw, mesh, true);
          DTensor out = dist::layer_norm(x, normalized, dw, db, 1e-5);
          EXPECT_TRUE(close(out.full_tensor().detach(), want.detach())) << what;
          backward_through_pieces(out, w);
          EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), p, mesh))) << what;
          EXPECT_TRUE(close(dw.grad().to_local(), expected_local(rw.grad(), pw, mesh))) << what << " (weight)";
          EXPECT_TRUE(close(db.grad().to_local(), expected_local(rb.grad(), pw, mesh))) << what << " (bias)";
        }
    }
  }
}

TEST(DTensorShapeOps, CrossEntropyOnABatchCutOrWhole) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto line = dist::init_device_mesh("cpu", {4}, {"x"});
  const Tensor class_weight = global_values({4}, 5.0).abs() + 0.5;
  const std::vector<F::CrossEntropyOptions> options = {
      {}, {.reduction = "sum"}, {.reduction = "none"}, {.ignore_index = 2}, {.weight = class_weight},
      {.weight = class_weight, .ignore_index = 0, .label_smoothing = 0.2}, {.label_smoothing = 0.1}};
  for (const dist::DeviceMesh* m : {&mesh, &line})
    for (int64_t n : {6, 5}) {  // 5 rows: uneven pieces, an empty one on 4 ranks
      const Tensor logits = global_values({n, 4});
      const Tensor labels = remainder(arange(n, TensorOptions(kInt64)), 4);
      const Tensor probs = softmax(global_values({n, 4}, 1.0), 1);
      for (const F::CrossEntropyOptions& o : options)
        for (bool by_index : {true, false}) {
          if (!by_index && o.ignore_index != -100) continue;  // probabilities take no ignore_index
          const Tensor tgt = by_index ? labels : probs;
          Tensor r = logits.clone().requires_grad_();
          Tensor want = F::cross_entropy(r, tgt, o);
          const Tensor w = global_values(want.shape(), 4.0);
          (want * w).sum().backward();
          for (const Placements& p : all_combinations(choices_for(logits.shape()), m->ndim()))
            for (const Placements& pt : all_combinations({Shard(0), Replicate()}, m->ndim())) {
              const std::string what = o.reduction + " " + text(p) + " target " + text(pt);
              DTensor x = make_dtensor(logits, p, *m, true), t = make_dtensor(tgt, pt, *m);
              DTensor out = dist::cross_entropy(x, t, o);
              EXPECT_TRUE(close(out.full_tensor().detach(), want.detach())) << what;
              backward_through_pieces(out, w);
              EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), p, *m))) << what;
            }
        }
    }
}

TEST(DTensorShapeOps, CrossEntropyWithEveryTargetIgnoredIsNanWithZeroGradient) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  const Tensor logits = global_values({5, 3});
  const Tensor labels = full({5}, 1, TensorOptions(kInt64));
  Tensor r = logits.clone().requires_grad_();
  Tensor want = F::cross_entropy(r, labels, {.ignore_index = 1});
  want.backward();
  for (const Placement& p : {Shard(0), Replicate()}) {
    DTensor x = make_dtensor(logits, {p}, mesh, true);
    DTensor out = dist::cross_entropy(x, make_dtensor(labels, {p}, mesh), {.ignore_index = 1});
    EXPECT_TRUE(std::isnan(out.full_tensor().item<double>())) << p.str();
    out.to_local().sum().backward();
    EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), {p}, mesh))) << p.str();
  }
  EXPECT_TRUE(std::isnan(want.item<double>()));
}

TEST(DTensorShapeOps, CrossEntropyMeanWithABadLabelOnOneRankRaisesOnEveryRank) {
  // the rank holding the bad label must not raise alone while the others wait in the count's all-reduce
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  Tensor labels = remainder(arange(8, TensorOptions(kInt64)), 3);
  labels = where(arange(8, TensorOptions(kInt64)) == 7, full({8}, 3, TensorOptions(kInt64)), labels);
  DTensor x = make_dtensor(global_values({8, 3}), {Shard(0)}, mesh, true);
  DTensor t = make_dtensor(labels, {Shard(0)}, mesh);
  EXPECT_TRUE(testing::throws_with([&] { dist::cross_entropy(x, t); }, {"cross_entropy", "out of range"}));
  EXPECT_TRUE(close(dist::softmax(x, 1).full_tensor().detach(), softmax(global_values({8, 3}), 1)));  // in step
}

TEST(DTensorShapeOps, BadArgumentsRaiseOnEveryRank) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto other = dist::init_device_mesh("cpu", {4}, {"x"});
  DTensor a = dist::distribute_tensor(global_values({4, 6}), mesh, {Shard(0), Shard(1)});
  DTensor w = dist::distribute_tensor(global_values({6}), other, {Replicate()});
  DTensor labels = dist::distribute_tensor(arange(4, TensorOptions(kInt64)), mesh, {Shard(0), Replicate()});
  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  raises([&] { dist::reshape(a, {5, 5}); }, {"reshape", "24"});
  raises([&] { dist::reshape(a, {-1, -1}); }, {"reshape", "-1"});
  raises([&] { dist::softmax(a, 2); }, {"softmax", "2"});
  raises([&] { dist::layer_norm(a, {4}); }, {"layer_norm", "normalized_shape"});
  raises([&] { dist::layer_norm(a, {6}, w); }, {"layer_norm", "device meshes"});
  raises([&] { dist::unsqueeze(a, 3); }, {"unsqueeze"});
  raises([&] { dist::mean(labels); }, {"mean", "floating"});
  raises([&] { dist::cross_entropy(a, dist::unsqueeze(labels, 1)); }, {"cross_entropy", "target"});
  raises([&] { dist::cross_entropy(a, labels, {.reduction = "avg"}); }, {"cross_entropy", "reduction"});
  raises([&] { dist::cross_entropy(dist::unsqueeze(a, 0), labels); }, {"cross_entropy", "(N, C)"});
  raises([&] { dist::exp(DTensor()); }, {"exp", "undefined"});
  EXPECT_TRUE(close(dist::softmax(a, 1).full_tensor(), softmax(global_values({4, 6}), 1)));  // still in step
}

}  // namespace
}  // namespace strata

