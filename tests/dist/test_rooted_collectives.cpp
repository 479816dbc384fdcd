// reduce, gather, scatter and all-to-all through the MPI process group under mpirun (2 and 4
// ranks): every root, every dtype (float16 and bfloat16 included) and contiguous and strided
// layouts, against the closed-form results of rank-dependent inputs computed in float64; the
// async forms; local argument errors.
#include "dist/collective_values.h"

namespace strata {
namespace {

using namespace dist_testing;  // NOLINT: the value helpers

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min};

TEST(RootedCollectives, ReduceToEveryDestination) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  for (int dst = 0; dst < n; ++dst)
    for (ReduceOp op : kOps)
      for (DType d : kAllDTypes)
        for (Layout layout : kLayouts) {
          if (op == ReduceOp::Avg && !is_floating(d)) continue;
          SCOPED_TRACE(fmt::format("dst {} {} {} {}", dst, op_name(op), d, testing::layout_name(layout)));
          auto mine = [&](int64_t i) { return value_for(op, r, i, d); };
          Tensor t = make(mine, d, layout);
          dist::reduce(t, dst, op);
          if (r == dst) EXPECT_EQ(values(t), expect([&](int64_t i) { return reduced(op, n, i, d); }, d));
          else EXPECT_EQ(values(t), expect(mine, d));  // a non-destination's tensor is left alone
        }
}

TEST(RootedCollectives, GatherToEveryDestination) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  for (int dst = 0; dst < n; ++dst)
    for (DType d : kAllDTypes)
      for (Layout layout : kLayouts) {
        SCOPED_TRACE(fmt::format("dst {} {} {}", dst, d, testing::layout_name(layout)));
        Tensor input = make([&](int64_t i) { return general_value(r, i, d); }, d, layout);
        std::vector<Tensor> outputs;
        if (r == dst)
          for (int k = 0; k < n; ++k) outputs.push_back(make([](int64_t) { return 0.0; }, d, layout));
        dist::gather(input, outputs, dst);
        for (int k = 0; k < static_cast<int>(outputs.size()); ++k)
          EXPECT_EQ(values(outputs[k]), expect([&](int64_t i) { return general_value(k, i, d); }, d)) << "from " << k;
      }
}

TEST(RootedCollectives, ScatterFromEverySource) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  const int64_t stride = checked_numel(kShape);
  for (int src = 0; src < n; ++src)
    for (DType d : kAllDTypes)
      for (Layout layout : kLayouts) {
        SCOPED_TRACE(fmt::format("src {} {} {}", src, d, testing::layout_name(layout)));
        // the source's input k holds general_value(src, k * stride + i)
        std::vector<Tensor> inputs;
        if (r == src)
          for (int k = 0; k < n; ++k)
            inputs.push_back(make([&](int64_t i) { return general_value(src, k * stride + i, d); }, d, layout));
        Tensor output = make([](int64_t) { return 0.0; }, d, layout);
        dist::scatter(output, inputs, src);
        EXPECT_EQ(values(output), expect([&](int64_t i) { return general_value(src, r * stride + i, d); }, d));
      }
}

TEST(RootedCollectives, AllToAllLists) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  const int64_t stride = checked_numel(kShape);
  for (DType d : kAllDTypes)
    for (Layout layout : kLayouts) {
      SCOPED_TRACE(fmt::format("{} {}", d, testing::layout_name(layout)));
      // rank r's input k (sent to rank k) holds general_value(r, k * stride + i)
      std::vector<Tensor> inputs, outputs;
      for (int k = 0; k < n; ++k) {
        inputs.push_back(make([&](int64_t i) { return general_value(r, k * stride + i, d); }, d, layout));
        outputs.push_back(make([](int64_t) { return 0.0; }, d, layout));
      }
      dist::all_to_all(outputs, inputs);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(values(outputs[k]), expect([&](int64_t i) { return general_value(k, r * stride + i, d); }, d))
            << "from " << k;
    }
}

TEST(RootedCollectives, AllToAllSingleEqualSplits) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  const Shape shape{2 * n, 3};
  const int64_t chunk = 6;  // elements per rank: 2 rows of 3
  for (DType d : kAllDTypes)
    for (Layout layout : kLayouts) {
      SCOPED_TRACE(fmt::format("{} {}", d, testing::layout_name(layout)));
      Tensor input = make([&](int64_t i) { return general_value(r, i, d); }, d, layout, shape);
      Tensor output = make([](int64_t) { return 0.0; }, d, layout, shape);
      dist::all_to_all_single(output, input);
      // chunk k of the output is rank k's chunk r
      auto from = [&](int64_t i) { return general_value(static_cast<int>(i / chunk), r * chunk + i % chunk, d); };
      EXPECT_EQ(values(output), expect(from, d, shape));
    }
}

TEST(RootedCollectives, AsyncFormsCompleteOnWait) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  Tensor sum = full({100}, r + 1.0, TensorOptions(kFloat64));
  Tensor in = full({3}, static_cast<double>(r), TensorOptions(kInt64));
  std::vector<Tensor> gathered;
  if (r == n - 1)
    for (int k = 0; k < n; ++k) gathered.push_back(zeros({3}, TensorOptions(kInt64)));
  Tensor a2a_in = arange(0, n, 1, TensorOptions(kFloat32)).add(10.0 * r), a2a_out = zeros({n}, TensorOptions(kFloat32));
  auto w1 = dist::reduce(sum, 0, ReduceOp::Sum, nullptr, true);
  auto w2 = dist::gather(in, gathered, n - 1, nullptr, true);
  auto w3 = dist::all_to_all_single(a2a_out, a2a_in, nullptr, true);
  ASSERT_TRUE(w1 && w2 && w3);
  w3->wait();
  w2->wait();
  w1->wait();
  EXPECT_EQ(values(sum), std::vector<double>(100, r == 0 ? n * (n + 1) / 2.0 : r + 1.0));
  for (int k = 0; k < static_cast<int>(gathered.size()); ++k) EXPECT_EQ(values(gathered[k]), std::vector<double>(3, k));
  std::vector<double> expected;
  for (int k = 0; k < n; ++k) expected.push_back(10.0 * k + r);  // rank k's element r
  EXPECT_EQ(values(a2a_out), expected);
}

TEST(RootedCollectives, LocalMistakesRaiseBeforeAnythingIsSent) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  Tensor f = zeros({3}, TensorOptions(kFloat32));
  auto raises = [](auto&& call, const char* needle) { EXPECT_TRUE(testing::throws_with(call, {needle})); };
  std::vector<Tensor> full_list(static_cast<size_t>(n), f);
  std::vector<Tensor> none;
  raises([&] { dist::reduce(f, n); }, "destination rank");
  raises([&] { dist::reduce(zeros({3}, TensorOptions(kInt32)), 0, ReduceOp::Avg); }, "floating dtype");
  raises([&] { dist::gather(f, none, -1); }, "out of range");
  // the list belongs to the root only, as torch.distributed's gather_list and scatter_list
  const int other = (r + 1) % n;
  if (n > 1) raises([&] { dist::gather(f, full_list, other); }, "must be empty");
  if (n > 1) raises([&] { dist::scatter(f, full_list, other); }, "must be empty");
  raises([&] { dist::gather(f, none, r); }, "0 output tensors given");
  raises([&] { dist::scatter(f, std::vector<Tensor>(static_cast<size_t>(n), zeros({3}, TensorOptions(kFloat64))), r); },
         "float64");
  raises([&] { dist::all_to_all(std::vector<Tensor>(static_cast<size_t>(n + 1), f), full_list); },
         "output tensors given");
  raises([&] { dist::all_to_all(full_list, none); }, "0 input tensors given");
  raises([&] { dist::all_to_all_single(zeros({2 * n + 1}), zeros({2 * n + 1})); }, "equal chunks");
  raises([&] { dist::all_to_all_single(zeros({2 * n}, TensorOptions(kFloat64)), zeros({2 * n})); }, "float64");
  // the group still works afterwards
  Tensor one = ones({2}, TensorOptions(kInt32));
  dist::reduce(one, 0);
  EXPECT_EQ(values(one), std::vector<double>(2, r == 0 ? n : 1));
}

}  // namespace
}  // namespace strata
