// DTensor layouts and redistribution under mpirun -np 4, on a 2 x 2 mesh and a 1-D mesh of 4
// with shapes that do not divide (torch.chunk's uneven pieces): every local piece against the
// block cut here from the global tensor with strata::chunk, every transition between Shard(0),
// Shard(1), Replicate and Partial against the global value, gradients through redistribute,
// to_local and full_tensor against the gradient of the same loss on the whole tensor, and bad
// input raising on every rank (the ranks then go on communicating, so none hung).
#include "dist/dtensor_testing.h"

namespace strata {
namespace {

using namespace dtensor_testing;
using dist::Partial;
using dist::Replicate;
using dist::ReduceOp;
using dist::Shard;

dist::DeviceMesh mesh_2x2() {
  auto world = dist_testing::group();
  EXPECT_EQ(world->size(), 4) << "run with mpirun -np 4";
  return dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
}

dist::DeviceMesh mesh_1d() {
  dist_testing::group();
  return dist::init_device_mesh("cpu", {4}, {"x"});
}

TEST(DTensorLayout, DistributeTensorGivesTorchChunkPieces) {
  auto mesh = mesh_2x2();
  const Tensor g = global_values({5, 3});
  for (const Placements& p : all_combinations({Shard(0), Shard(1), Replicate()}, 2)) {
    Tensor sent = dist::get_rank() == 0 ? g : zeros_like(g);  // only the first rank's data counts
    dist::DTensor d = dist::distribute_tensor(sent, mesh, p);
    EXPECT_EQ(d.shape(), g.shape());
    EXPECT_EQ(d.stride(), (Strides{3, 1}));
    EXPECT_TRUE(close(d.to_local(), expected_local(g, p, mesh))) << text(p);
    EXPECT_TRUE(close(d.full_tensor(), g)) << text(p);
  }
  // nested uneven: 5 rows over dp then tp: dp gives 3 | 2, tp cuts those into 2 | 1 and 1 | 1
  dist::DTensor d = dist::distribute_tensor(g, mesh, {Shard(0), Shard(0)});
  const int64_t rows[4] = {2, 1, 1, 1};
  EXPECT_EQ(d.to_local().size(0), rows[dist::get_rank()]);
}

TEST(DTensorLayout, FromLocalInfersEvenShapesAndChecksThemOnRequest) {
  auto mesh = mesh_1d();
  Tensor local = full({2, 3}, static_cast<double>(dist::get_rank()), TensorOptions(kFloat64));
  dist::DTensor d = dist::DTensor::from_local(local, mesh, {Shard(0)});
  EXPECT_EQ(d.shape(), (Shape{8, 3}));
  EXPECT_TRUE(d.to_local().is_same(local));
  Tensor full_value = d.full_tensor();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(full_value.select(0, 2 * r).select(0, 0).item<double>(), r);
  // run_check broadcasts group rank 0's data along Replicate dims
  Tensor rep = full({2}, static_cast<double>(dist::get_rank() + 7), TensorOptions(kFloat64));
  dist::DTensor r = dist::DTensor::from_local(rep, mesh, {Replicate()}, /*run_check=*/true);
  EXPECT_TRUE(close(r.to_local(), full({2}, 7.0, TensorOptions(kFloat64))));
}

// For every source and target layout: the target's pieces are the target's blocks of the global
// value; a Partial target's pieces reduce to it.
void check_all_transitions(const dist::DeviceMesh& mesh, const Shape& shape, const Placements& choices) {
  const Tensor g = global_values(shape);
  const auto layouts = all_combinations(choices, mesh.ndim());
  for (const Placements& from : layouts) {
    dist::DTensor x = make_dtensor(g, from, mesh);
    EXPECT_TRUE(close(x.full_tensor(), g)) << "source " << text(from);
    for (const Placements& to : layouts) {
      dist::DTensor y = x.redistribute(mesh, to);
      EXPECT_EQ(y.placements(), to);
      bool partial = false;
      for (const Placement& p : to) partial = partial || p.is_partial();
      if (!partial) {
        EXPECT_TRUE(close(y.to_local(), expected_local(g, to, mesh))) << text(from) << " -> " << text(to);
      } else {
        EXPECT_EQ(y.to_local().shape(), expected_local(g, to, mesh).shape()) << text(from) << " -> " << text(to);
        EXPECT_TRUE(close(y.full_tensor(), g)) << text(from) << " -> " << text(to);
      }
    }
  }
}

TEST(DTensorRedistribute, EveryTransitionOnATwoByTwoMesh) {
  check_all_transitions(mesh_2x2(), {5, 7}, {Shard(0), Shard(1), Replicate(), Partial()});
}

TEST(DTensorRedistribute, EveryTransitionOnAOneDimMeshWithUnevenAndEmptyPieces) {
  // 5 rows over 4 ranks: 2, 2, 1, 0; 3 columns: 1, 1, 1, 0
  check_all_transitions(mesh_1d(), {5, 3}, {Shard(0), Shard(1), Replicate(), Partial()});
  check_all_transitions(mesh_1d(), {2, 6, 3}, {Shard(0), Shard(2), Replicate(), Partial()});
}

TEST(DTensorRedistribute, ThreeDimMeshWithASizeOneDim) {
  dist_testing::group();
  check_all_transitions(dist::init_device_mesh("cpu", {2, 1, 2}, {"a", "b", "c"}), {3, 5},
                        {Shard(0), Replicate(), Partial()});
}

TEST(DTensorRedistribute, IntegerPartialSumKeepsTheValueOnGroupRankZero) {
  auto mesh = mesh_1d();
  const Tensor g = arange(12, TensorOptions(kInt64)).view({3, 4});
  dist::DTensor p = dist::distribute_tensor(g, mesh, {Replicate()}).redistribute({Partial()});
  EXPECT_TRUE(equal(p.to_local(), mesh.get_local_rank() == 0 ? g : zeros_like(g)));
  EXPECT_TRUE(equal(p.full_tensor(), g));
  EXPECT_TRUE(equal(p.redistribute({Shard(1)}).to_local(), expected_local(g, {Shard(1)}, mesh)));
}

TEST(DTensorRedistribute, PartialAvgMaxMinReduceAsTheirOps) {
  auto mesh = mesh_1d();
  const int c = mesh.get_local_rank();
  const Tensor g = global_values({6, 2});
  // Avg: parts g + (c - 1.5) average to g; Max / Min: parts g - c and g + c peak at g
  const std::pair<ReduceOp, Tensor> cases[] = {{ReduceOp::Avg, g.add(c - 1.5)},
                                               {ReduceOp::Max, g.sub(static_cast<double>(c))},
                                               {ReduceOp::Min, g.add(static_cast<double>(c))}};
  for (const auto& [op, part] : cases) {
    dist::DTensor x = dist::DTensor::from_local(part, mesh, {Partial(op)});
    EXPECT_TRUE(close(x.full_tensor(), g)) << Partial(op).str();
    EXPECT_TRUE(close(x.redistribute({Shard(0)}).to_local(), expected_local(g, {Shard(0)}, mesh))) << Partial(op).str();
    // Replicate -> Partial(op) -> Replicate keeps the value
    EXPECT_TRUE(close(x.redistribute({Replicate()}).redistribute({Partial(op)}).full_tensor(), g));
  }
  // Partial(sum) -> Partial(avg) goes through the value
  dist::DTensor s = make_dtensor(g, {Partial()}, mesh);
  EXPECT_TRUE(close(s.redistribute({Partial(ReduceOp::Avg)}).full_tensor(), g));
}

// Gradients: loss = sum(y * w) for y = x.redistribute(to), each rank summing its own piece of y
// against w's block (a Partial or Replicate piece against the whole block). The leaf's gradient
// is w's block in the source layout, as the gradient of sum(g * w) over the whole tensor is w.
void check_gradients(const dist::DeviceMesh& mesh, const Shape& shape, const Placements& choices) {
  const Tensor g = global_values(shape), w = global_values(shape, 1.0);
  const auto layouts = all_combinations(choices, mesh.ndim());
  for (const Placements& from : layouts)
    for (const Placements& to : layouts) {
      dist::DTensor x = make_dtensor(g, from, mesh, /*requires_grad=*/true);
      dist::DTensor y = x.redistribute(to);
      (y.to_local() * expected_local(w, to, mesh)).sum().backward();
      const dist::DTensor grad = x.grad();
      ASSERT_TRUE(grad.defined()) << text(from) << " -> " << text(to);
      EXPECT_TRUE(close(grad.to_local(), expected_local(w, from, mesh))) << text(from) << " -> " << text(to);
      for (const Placement& p : grad.placements()) EXPECT_FALSE(p.is_partial());
    }
}

TEST(DTensorRedistribute, GradientsAreTheAdjointRedistributions) {
  check_gradients(mesh_2x2(), {5, 3}, {Shard(0), Shard(1), Replicate(), Partial()});
  check_gradients(mesh_1d(), {6, 3}, {Shard(0), Shard(1), Replicate(), Partial()});
}

TEST(DTensorRedistribute, FullTensorAndToLocalGradients) {
  auto mesh = mesh_2x2();
  const Tensor g = global_values({4, 5}), w = global_values({4, 5}, 2.0);
  dist::DTensor x = make_dtensor(g, {Shard(1), Shard(0)}, mesh, true);
  (x.full_tensor() * w).sum().backward();  // every rank the same loss on the whole value
  EXPECT_TRUE(close(x.grad().to_local(), expected_local(w, {Shard(1), Shard(0)}, mesh)));

  // each rank its own loss from a replicated value: the gradient is their sum (Partial)
  auto line = mesh_1d();
  dist::DTensor r = make_dtensor(g, {Replicate()}, line, true);
  const double scale = dist::get_rank() + 1;
  (r.to_local(Placements{Partial()}) * w * scale).sum().backward();
  EXPECT_TRUE(close(r.grad().to_local(), w * 10.0));  // 1 + 2 + 3 + 4
}

// Partial(sum) over mesh dim 0 of Partial(max) over mesh dim 1: the value is the sum over i of
// the max over j of the parts x_ij (the last mesh dim reduced first, as full_tensor does), which
// every redistribution keeps; reducing dim 0 alone first would give the max of the sums.
TEST(DTensorRedistribute, MixedPartialOpsOnTwoMeshDims) {
  auto mesh = mesh_2x2();
  const int i = mesh.get_local_rank(0), j = mesh.get_local_rank(1);
  const Tensor g = global_values({3, 4});
  // max over j of x_ij is g / 2 (at j == i), so the sum over i is g; the sums over i are g - 1
  const Tensor part = g.div(2.0).sub(i == j ? 0.0 : 1.0);
  using Ops = std::pair<ReduceOp, ReduceOp>;
  for (const auto& [outer, inner] : {Ops{ReduceOp::Sum, ReduceOp::Max}, Ops{ReduceOp::Avg, ReduceOp::Min}}) {
    // avg over i of min over j of g + (i != j) is g too
    const Tensor x_ij = outer == ReduceOp::Sum ? part : g.add(i == j ? 0.0 : 1.0);
    dist::DTensor x = dist::DTensor::from_local(x_ij, mesh, {Partial(outer), Partial(inner)});
    ASSERT_TRUE(close(x.full_tensor(), g));
    for (const Placement& p : {Shard(0), Shard(1), Replicate(), Partial(outer), Partial(inner)})
      EXPECT_TRUE(close(x.redistribute({p, Partial(inner)}).full_tensor(), g)) << p.str() << " over " << x.str();
  }
}

TEST(DTensorRedistribute, BackwardOfAOneElementShardedLoss) {
  auto mesh = mesh_1d();
  const TensorOptions f64(kFloat64);
  // one element over 4 ranks: rank 0 holds it, the others an empty piece, and all call backward
  dist::DTensor x = dist::distribute_tensor(full({1}, 2.0, f64).requires_grad_(), mesh, {Shard(0)});
  ASSERT_NO_THROW(x.backward());
  EXPECT_TRUE(close(x.grad().to_local(), expected_local(ones({1}, f64), {Shard(0)}, mesh)));
  // with a collective in the backward (the chunk's all-gather) every rank must take part
  dist::DTensor r = dist::distribute_tensor(full({1}, 3.0, f64).requires_grad_(), mesh, {Replicate()});
  ASSERT_NO_THROW(r.redistribute({Shard(0)}).backward());
  EXPECT_TRUE(close(r.grad().to_local(), ones({1}, f64)));
}

TEST(DTensorErrors, BadInputRaisesOnEveryRankAndNothingHangs) {
  auto mesh = mesh_2x2();
  auto line = mesh_1d();
  const Tensor g = global_values({4, 4});
  dist::DTensor x = dist::distribute_tensor(g, mesh, {Shard(0), Replicate()});
  EXPECT_THROW(x.redistribute({Shard(0)}), Error);                       // one placement for two mesh dims
  EXPECT_THROW(x.redistribute({Shard(2), Replicate()}), Error);          // no dim 2
  EXPECT_THROW(x.redistribute(line, {Replicate()}), Error);              // another mesh
  EXPECT_THROW(Partial(ReduceOp::Product), Error);
  EXPECT_THROW(dist::distribute_tensor(g, mesh, {Partial(), Replicate()}), Error);
  // one rank's shape differs: every rank raises, the odd one with its own message
  const Tensor odd = dist::get_rank() == 3 ? global_values({4, 5}) : g;
  EXPECT_THROW(dist::distribute_tensor(odd, mesh, {Shard(0), Shard(1)}), Error);
  const Tensor odd_dtype = dist::get_rank() == 2 ? g.to(kFloat32) : g;  // the dtype too
  EXPECT_THROW(dist::distribute_tensor(odd_dtype, mesh, {Shard(0), Replicate()}), Error);
  const Tensor piece = dist::get_rank() == 1 ? global_values({3, 4}) : global_values({2, 4});
  try {
    dist::DTensor::from_local(piece, mesh, {Shard(0), Replicate()}, /*run_check=*/true, Shape{4, 4});
    ADD_FAILURE() << "from_local accepted a rank whose piece does not fit";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dist::get_rank() == 1 ? "local tensor has shape [3, 4]" : "another rank"), std::string::npos)
        << what;
  }
  // placements only one rank gets wrong: with run_check every rank raises
  const int64_t bad_dim = dist::get_rank() == 2 ? 3 : 1;
  EXPECT_THROW(dist::DTensor::from_local(global_values({2, 4}), mesh, {Shard(0), Shard(bad_dim)}, true), Error);
  // inferred global shapes differ between ranks (6 rows on rank 1, 4 elsewhere)
  EXPECT_TRUE(testing::throws_with([&] { dist::DTensor::from_local(piece, mesh, {Shard(0), Replicate()}, true); },
                                   {"disagree on the dtype, the global shape or the placements"}));
  EXPECT_THROW(dist::DTensor::from_local(global_values({3, 4}), mesh, {Shard(0), Replicate()}, false,
                                         Shape{4, 4}),
               Error);  // 4 rows over 2 ranks give 2 each, not 3
  // a gradient layout must cut the local tensor as the DTensor's does (only Replicate and
  // Partial may trade places): a Shard gradient for a replicated piece would not fit it
  dist::DTensor rep = dist::distribute_tensor(g, mesh, {Replicate(), Replicate()});
  EXPECT_TRUE(testing::throws_with([&] { rep.to_local(Placements{Shard(0), Replicate()}); }, {"grad_placements"}));
  EXPECT_THROW(x.to_local(Placements{Shard(1), Replicate()}), Error);
  EXPECT_NO_THROW(x.to_local(Placements{Shard(0), Partial()}));
  // the ranks still agree on what to call next
  EXPECT_TRUE(close(x.full_tensor(), g));
}

}  // namespace
}  // namespace strata
