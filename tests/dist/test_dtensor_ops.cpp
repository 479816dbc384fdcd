// DTensor ops under mpirun -np 4: for every combination of operand placements (Shard(i),
// Replicate, Partial on each dim of a 2 x 2 mesh), the result's global value equals the op on
// the whole tensors, and each operand's gradient (of a loss summed over the output's pieces)
// equals its block of the gradient the same op gives in one process; the placement rules for
// matmul and sum; uneven and empty pieces on 4 ranks, Partial(avg) operands, mixed dtypes; bad
// operands raising on every rank.
#include "dist/dtensor_testing.h"

namespace strata {
namespace {

using namespace dtensor_testing;
using dist::DTensor;
using dist::Partial;
using dist::Replicate;
using dist::Shard;

dist::DeviceMesh mesh_2x2() {
  auto world = dist_testing::group();
  EXPECT_EQ(world->size(), 4) << "run with mpirun -np 4";
  return dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
}

const Placements kChoices{Shard(0), Shard(1), Replicate(), Partial()};

template <class DOp, class Ref>
void check_binary(const dist::DeviceMesh& mesh, const Shape& sa, const Shape& sb, DOp op, Ref ref,
                  const char* name) {
  const Tensor ga = global_values(sa), gb = global_values(sb, 0.7);
  Tensor ra = ga.clone().requires_grad_(), rb = gb.clone().requires_grad_();
  Tensor want = ref(ra, rb);
  const Tensor w = global_values(want.shape(), 2.0);
  (want * w).sum().backward();
  for (const Placements& pa : all_combinations(choices_for(sa), mesh.ndim()))
    for (const Placements& pb : all_combinations(choices_for(sb), mesh.ndim())) {
      const std::string what = std::string(name) + " " + text(pa) + " x " + text(pb);
      DTensor a = make_dtensor(ga, pa, mesh, true), b = make_dtensor(gb, pb, mesh, true);
      DTensor out = op(a, b);
      ASSERT_EQ(out.shape(), want.shape()) << what;
      EXPECT_TRUE(close(out.full_tensor().detach(), want.detach())) << what << " -> " << text(out.placements());
      backward_through_pieces(out, w);
      EXPECT_TRUE(close(a.grad().to_local(), expected_local(ra.grad(), pa, mesh))) << what << " (grad a)";
      EXPECT_TRUE(close(b.grad().to_local(), expected_local(rb.grad(), pb, mesh))) << what << " (grad b)";
    }
}

TEST(DTensorOps, ElementwiseWithBroadcasting) {
  auto mesh = mesh_2x2();
  check_binary(mesh, {4, 5}, {4, 5}, dist::add, [](const Tensor& a, const Tensor& b) { return a + b; }, "add");
  check_binary(mesh, {4, 5}, {5}, dist::sub, [](const Tensor& a, const Tensor& b) { return a - b; }, "sub");
  check_binary(mesh, {3, 5}, {1, 5}, [](const DTensor& a, const DTensor& b) { return a * b; },
               [](const Tensor& a, const Tensor& b) { return a * b; }, "mul");
}

TEST(DTensorOps, MatmulEveryPlacementPair) {
  auto mesh = mesh_2x2();
  check_binary(mesh, {5, 6}, {6, 3}, dist::matmul, [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
               "matmul");
  check_binary(mesh, {2, 3, 4}, {4, 5}, dist::matmul, [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
               "batched matmul");
}

TEST(DTensorOps, MatmulPlacementRules) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"tp"});
  const Tensor a = global_values({8, 8}), b = global_values({8, 4}, 1.0);
  auto out = [&](Placement pa, Placement pb) {
    return dist::matmul(dist::distribute_tensor(a, mesh, {pa}), dist::distribute_tensor(b, mesh, {pb})).placements();
  };
  EXPECT_EQ(out(Shard(1), Shard(0)), Placements{Partial()});
  EXPECT_EQ(out(Replicate(), Shard(1)), Placements{Shard(1)});
  EXPECT_EQ(out(Shard(0), Replicate()), Placements{Shard(0)});
  EXPECT_EQ(out(Replicate(), Replicate()), Placements{Replicate()});
  EXPECT_EQ(out(Shard(1), Replicate()), Placements{Partial()});  // b chunked locally, no gather
}

TEST(DTensorOps, LinearColwiseThenRowwise) {
  auto mesh = mesh_2x2();
  const Tensor x = global_values({3, 6}), w1 = global_values({8, 6}, 1.0), b1 = global_values({8}, 2.0);
  const Tensor w2 = global_values({4, 8}, 3.0), b2 = global_values({4}, 4.0);
  Tensor rx = x.clone().requires_grad_(), rw1 = w1.clone().requires_grad_(), rw2 = w2.clone().requires_grad_();
  Tensor want = linear(relu(linear(rx, rw1, b1)), rw2, b2);
  const Tensor loss_w = global_values(want.shape(), 5.0);
  (want * loss_w).sum().backward();
  // data parallel over dp (rows of x), tensor parallel over tp: W1 by rows, W2 by columns
  DTensor dx = make_dtensor(x, {Shard(0), Replicate()}, mesh, true);
  DTensor dw1 = make_dtensor(w1, {Replicate(), Shard(0)}, mesh, true);
  DTensor db1 = make_dtensor(b1, {Replicate(), Shard(0)}, mesh);
  DTensor dw2 = make_dtensor(w2, {Replicate(), Shard(1)}, mesh, true);
  DTensor db2 = make_dtensor(b2, {Replicate(), Replicate()}, mesh);
  DTensor h = dist::relu(dist::linear(dx, dw1, db1));
  EXPECT_EQ(h.placements(), (Placements{Shard(0), Shard(1)}));  // colwise: no communication
  DTensor y = dist::linear(h, dw2, db2);
  EXPECT_EQ(y.placements(), (Placements{Shard(0), Replicate()}));  // rowwise: one all-reduce
  EXPECT_TRUE(close(y.full_tensor().detach(), want.detach()));
  backward_through_pieces(y, loss_w);
  EXPECT_TRUE(close(dx.grad().to_local(), expected_local(rx.grad(), dx.placements(), mesh)));
  EXPECT_TRUE(close(dw1.grad().to_local(), expected_local(rw1.grad(), dw1.placements(), mesh)));
  EXPECT_TRUE(close(dw2.grad().to_local(), expected_local(rw2.grad(), dw2.placements(), mesh)));
}

TEST(DTensorOps, SumOverShardedDimsIsPartial) {
  auto mesh = mesh_2x2();
  const Tensor g = global_values({5, 7});
  const std::vector<std::pair<std::vector<int64_t>, bool>> cases = {{{0}, false}, {{1}, true}, {{}, false},
                                                                   {{-1, 0}, true}};
  for (const auto& [dims, keepdim] : cases) {
    Tensor r = g.clone().requires_grad_();
    Tensor want = dims.empty() ? r.sum() : r.sum(dims, keepdim);
    const Tensor w = global_values(want.shape(), 3.0);
    (want * w).sum().backward();
    for (const Placements& p : all_combinations(kChoices, 2)) {
      DTensor x = make_dtensor(g, p, mesh, true);
      DTensor s = dist::sum(x, dims, keepdim);
      EXPECT_TRUE(close(s.full_tensor().detach(), want.detach())) << text(p);
      for (size_t i = 0; i < p.size(); ++i) {
        const bool summed = p[i].is_shard() && (dims.empty() || std::count(dims.begin(), dims.end(), p[i].dim) ||
                                                std::count(dims.begin(), dims.end(), p[i].dim - 2));
        if (summed) EXPECT_TRUE(s.placements()[i].is_partial()) << text(p) << " -> " << text(s.placements());
      }
      backward_through_pieces(s, w);
      EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), p, mesh))) << text(p);
    }
  }
}

TEST(DTensorOps, NonlinearUnaryOpsReducePartialsFirst) {
  auto mesh = mesh_2x2();
  const Tensor g = global_values({4, 3});
  Tensor r = g.clone().requires_grad_();
  Tensor want = relu(r) + gelu(r, "tanh");
  const Tensor w = global_values(want.shape(), 1.0);
  (want * w).sum().backward();
  for (const Placements& p : all_combinations(kChoices, 2)) {
    DTensor x = make_dtensor(g, p, mesh, true);
    DTensor out = dist::relu(x) + dist::gelu(x, "tanh");
    EXPECT_TRUE(close(out.full_tensor().detach(), want.detach())) << text(p);
    for (const Placement& q : out.placements()) EXPECT_FALSE(q.is_partial());
    backward_through_pieces(out, w);
    EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), p, mesh))) << text(p);
  }
}

TEST(DTensorOps, BadOperandsRaiseOnEveryRank) {
  auto mesh = mesh_2x2();
  auto other = dist::init_device_mesh("cpu", {4}, {"x"});
  DTensor a = dist::distribute_tensor(global_values({3, 4}), mesh, {Shard(0), Replicate()});
  DTensor b = dist::distribute_tensor(global_values({5, 4}), mesh, {Replicate(), Shard(1)});
  DTensor c = dist::distribute_tensor(global_values({3, 4}), other, {Shard(0)});
  EXPECT_THROW(dist::add(a, b), Error);     // (3, 4) + (5, 4)
  EXPECT_THROW(dist::matmul(a, b), Error);  // K: 4 != 5
  EXPECT_THROW(dist::mul(a, c), Error);     // two meshes
  EXPECT_THROW(dist::matmul(dist::sum(a, {0}), b), Error);  // a 1-D operand
  EXPECT_THROW(dist::sum(a, {2}), Error);
  EXPECT_THROW(dist::relu(DTensor()), Error);
  EXPECT_TRUE(close(dist::add(a, a).full_tensor(), global_values({3, 4}) * 2.0));  // still in step
}

TEST(DTensorOps, UnevenAndEmptyPiecesOnFourRanks) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  // K = 3 over 4 ranks: the last rank multiplies an empty piece
  check_binary(mesh, {5, 3}, {3, 2}, dist::matmul, [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
               "matmul K=3");
  check_binary(mesh, {2, 3}, {3, 1}, dist::matmul, [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
               "matmul N=1");
  check_binary(mesh, {5, 3}, {1, 3}, dist::add, [](const Tensor& a, const Tensor& b) { return a + b; }, "add");
  check_binary(mesh, {5, 1}, {3}, [](const DTensor& a, const DTensor& b) { return a * b; },
               [](const Tensor& a, const Tensor& b) { return a * b; }, "mul");
  check_binary(mesh, {2, 1, 3}, {5, 1}, dist::sub, [](const Tensor& a, const Tensor& b) { return a - b; }, "sub3");
}

TEST(DTensorOps, PartialAvgOperands) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  const int c = mesh.get_local_rank();
  const Tensor ga = global_values({5, 3}), gb = global_values({3, 2}, 0.3), gc = global_values({5, 3}, 0.9);
  // parts g + (c - 1.5) average to g; avg stays avg through linear ops with a replicated factor
  auto avg = [&](const Tensor& g) {
    Tensor part = g.add(c - 1.5).detach().requires_grad_();
    return DTensor::from_local(part, mesh, {Partial(dist::ReduceOp::Avg)});
  };
  DTensor a = avg(ga);
  DTensor b = dist::distribute_tensor(gb.clone().requires_grad_(), mesh, {Replicate()});
  DTensor m = dist::matmul(a, b);
  EXPECT_TRUE(close(m.full_tensor().detach(), matmul(ga, gb))) << text(m.placements());
  DTensor cc = avg(gc);
  DTensor s = a + cc;
  EXPECT_TRUE(close(s.full_tensor().detach(), ga + gc)) << text(s.placements());
  DTensor p = a * dist::distribute_tensor(gc, mesh, {Replicate()});
  EXPECT_TRUE(close(p.full_tensor().detach(), ga * gc)) << text(p.placements());
  DTensor su = dist::sum(a, {0}, true);
  EXPECT_TRUE(close(su.full_tensor().detach(), ga.sum({0}, true))) << text(su.placements());
  for (const DTensor* t : {&m, &s, &p, &su}) EXPECT_EQ(t->placements(), Placements{Partial(dist::ReduceOp::Avg)});
  DTensor sh = a.redistribute({Shard(0)});
  EXPECT_TRUE(close(sh.to_local(), expected_local(ga, {Shard(0)}, mesh)));
  // b's gradient through the avg matmul: avg(a)^T g
  const Tensor w = global_values({5, 2}, 2.0);
  (m.full_tensor() * w).sum().backward();
  EXPECT_TRUE(close(b.grad().to_local(), matmul(ga.transpose(0, 1), w)));
}

TEST(DTensorOps, MixedDtypesPromoteAndKeepGradientDtypes) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"a", "b"});
  const Tensor ga = global_values({5, 3}), gb = global_values({5, 3}, 0.4).to(kFloat32);
  for (const Placements& pa : all_combinations(kChoices, 2))
    for (const Placements& pb : all_combinations(kChoices, 2)) {
      DTensor a = make_dtensor(ga, pa, mesh, true), b = make_dtensor(gb, pb, mesh, true);
      DTensor out = a * b;
      EXPECT_TRUE(allclose(out.full_tensor().detach(), ga * gb.to(kFloat64), 1e-5, 1e-5)) << text(pa) << text(pb);
      backward_through_pieces(out, ones({5, 3}, TensorOptions(kFloat64)));
      EXPECT_EQ(b.grad().dtype(), kFloat32);
      EXPECT_TRUE(allclose(b.grad().to_local(), expected_local(ga, pb, mesh).to(kFloat32), 1e-5, 1e-5));
    }
}

// 3 columns over 4 ranks: 1, 1, 1, 0
TEST(DTensorOps, SumGeluTransposeOnEmptyPieces) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {4}, {"x"});
  const Tensor g = global_values({3, 5});
  for (const Placement& pl : {Shard(0), Shard(1), Replicate(), Partial()})
    for (const auto& [dims, keep] : std::vector<std::pair<std::vector<int64_t>, bool>>{{{0}, true}, {{1}, true},
                                                                                     {{}, false}, {{0, 1}, true}}) {
      Tensor r = g.clone().requires_grad_();
      Tensor want = dims.empty() ? gelu(r).sum() : gelu(r).sum(dims, keep);
      const Tensor w = global_values(want.shape(), 3.0);
      (want * w).sum().backward();
      DTensor x = make_dtensor(g, {pl}, mesh, true);
      DTensor s = dist::sum(dist::gelu(dist::transpose(dist::transpose(x, 0, 1), 0, 1)), dims, keep);
      EXPECT_TRUE(close(s.full_tensor().detach(), want.detach())) << pl.str();
      backward_through_pieces(s, w);
      EXPECT_TRUE(close(x.grad().to_local(), expected_local(r.grad(), {pl}, mesh))) << pl.str();
    }
  // transposed (non-contiguous) pieces through every redistribution
  DTensor t = dist::transpose(make_dtensor(g, {Shard(1)}, mesh), 0, 1);
  for (const Placement& pl : {Shard(0), Shard(1), Replicate(), Partial()})
    EXPECT_TRUE(close(t.redistribute({pl}).full_tensor(), g.transpose(0, 1).contiguous())) << pl.str();
  EXPECT_TRUE(close(dist::matmul(t, make_dtensor(g, {Shard(0)}, mesh)).full_tensor(),
                    matmul(g.transpose(0, 1), g)));
}

}  // namespace
}  // namespace strata
