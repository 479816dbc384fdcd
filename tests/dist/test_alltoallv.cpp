// Uneven all-to-all under mpirun (2 and 4 ranks): all_to_all_single with split sizes and
// all_to_all with tensors of different sizes per peer, every dtype and layout, empty parts
// included, against the exchange computed locally from every rank's closed-form input; the
// async form; local mistakes raise before anything is sent, and split sizes that disagree
// across ranks raise on every rank, after which the group still works.
#include <numeric>

#include "dist/collective_values.h"

namespace strata {
namespace {

using namespace dist_testing;

// Rows rank `from` sends rank `to`: 0, 1 or 2, so some parts are empty and the sizes differ by
// direction.
int64_t rows(int from, int to) { return (from + 2 * to) % 3; }

// Element (row j, column c) of what rank `from` sends rank `to`: distinct in wide dtypes.
double sent_value(int from, int to, int64_t j, int64_t c) {
  return static_cast<double>(from * 64 + to * 16 + j * 4 + c);
}

constexpr int64_t kWidth = 3;

// Row i of the concatenation of the parts for ranks 0..n-1 with `part_rows[k]` rows each: its
// part k and its row within it.
std::pair<int, int64_t> locate(const std::vector<int64_t>& part_rows, int64_t i) {
  int k = 0;
  while (i >= part_rows[static_cast<size_t>(k)]) i -= part_rows[static_cast<size_t>(k++)];
  return {k, i};
}

TEST(AllToAllUneven, SingleWithSplitSizesExchangesTheRowsOfEveryPeer) {
  auto pg = group();
  const int r = pg->rank(), n = pg->size();
  std::vector<int64_t> in_splits, out_splits;
  for (int k = 0; k < n; ++k) {
    in_splits.push_back(rows(r, k));
    out_splits.push_back(rows(k, r));
  }
  const Shape in_shape{std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0}), kWidth};
  const Shape out_shape{std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0}), kWidth};
  auto input_at = [&](int64_t i) {
    auto [to, j] = locate(in_splits, i / kWidth);
    return sent_value(r, to, j, i % kWidth);
  };
  auto output_at = [&](int64_t i) {  // the rows rank `from` sent this rank, in rank order
    auto [from, j] = locate(out_splits, i / kWidth);
    return sent_value(from, r, j, i % kWidth);
  };
  for (DType d : kAllDTypes)
    for (Layout layout : kLayouts)
      for (bool async : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {}{}", d, testing::layout_name(layout), async ? " async" : ""));
        Tensor input = make(input_at, d, layout, in_shape);
        Tensor output = make([](int64_t) { return -1.0; }, d, layout, out_shape);
        auto work = dist::all_to_all_single(output, input, out_splits, in_splits, nullptr, async);
        ASSERT_EQ(work != nullptr, async);
        if (work) work->wait();
        EXPECT_EQ(values(output), expect(output_at, d, out_shape));
      }
}

// An empty list splits that side equally; with both sides equal this is the even exchange.
TEST(AllToAllUneven, AnEmptySplitListMeansEqualParts) {
  auto pg = group();
  const int r = pg->rank(), n = pg->size();
  std::vector<int64_t> in_splits;
  // every rank sends 2 rows to rank 0 and 1 to the others, so rank 0 receives 2 from each, and
  // the others 1 from each: equal parts on the receiving side
  for (int k = 0; k < n; ++k) in_splits.push_back(k == 0 ? 2 : 1);
  const int64_t each = r == 0 ? 2 : 1;
  Tensor input = zeros({n + 1, kWidth}, TensorOptions(kFloat64));
  for (int64_t i = 0; i < input.numel(); ++i) input.view({-1})[i].fill_(static_cast<double>(r * 100 + i));
  Tensor output = zeros({each * n, kWidth}, TensorOptions(kFloat64));
  dist::all_to_all_single(output, input, std::vector<int64_t>{}, in_splits);
  const int64_t first_row = r == 0 ? 0 : 2 + (r - 1);  // where rank r's part starts in a sender's input
  std::vector<double> want;
  for (int from = 0; from < n; ++from)
    for (int64_t e = 0; e < each * kWidth; ++e) want.push_back(from * 100 + first_row * kWidth + e);
  EXPECT_EQ(values(output), want);
}

TEST(AllToAllUneven, ListOfTensorsOfDifferentSizesPerPeer) {
  auto pg = group();
  const int r = pg->rank(), n = pg->size();
  for (DType d : kAllDTypes)
    for (Layout layout : kLayouts)
      for (bool async : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {}{}", d, testing::layout_name(layout), async ? " async" : ""));
        std::vector<Tensor> outputs;
        std::shared_ptr<dist::Work> work;
        {  // the inputs are gone before an async exchange is waited for
          std::vector<Tensor> inputs;
          for (int k = 0; k < n; ++k) {
            // rows(r, k) + 1 rows of kWidth to rank k; what rank k sends arrives as one flat tensor
            inputs.push_back(make([&](int64_t i) { return sent_value(r, k, i / kWidth, i % kWidth); }, d, layout,
                                  Shape{rows(r, k) + 1, kWidth}));
            outputs.push_back(
                make([](int64_t) { return -1.0; }, d, Layout::Contiguous, Shape{(rows(k, r) + 1) * kWidth}));
          }
          work = dist::all_to_all(outputs, inputs, nullptr, async);
        }
        ASSERT_EQ(work != nullptr, async);
        if (work) work->wait();
        for (int k = 0; k < n; ++k) {
          auto from = [&](int64_t i) { return sent_value(k, r, i / kWidth, i % kWidth); };
          EXPECT_EQ(values(outputs[static_cast<size_t>(k)]), expect(from, d, Shape{(rows(k, r) + 1) * kWidth}))
              << "from " << k;
        }
      }
}

TEST(AllToAllUneven, LocalMistakesRaise) {
  auto pg = group();
  const int n = pg->size();
  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  const std::vector<int64_t> ones_each(static_cast<size_t>(n), 1);
  Tensor in = zeros({n, 2}), out = zeros({n, 2});
  std::vector<int64_t> too_many = ones_each;
  too_many[0] = 2;
  raises([&] { dist::all_to_all_single(out, in, ones_each, too_many); },
         {"[all_to_all_single]", "input split sizes sum to", std::to_string(n + 1).c_str()});
  raises([&] { dist::all_to_all_single(out, in, too_many, ones_each); }, {"output split sizes sum to"});
  raises([&] { dist::all_to_all_single(out, in, ones_each, std::vector<int64_t>{int64_t{n}}); },
         {"1 input split sizes given for"});
  std::vector<int64_t> negative = ones_each;
  negative[0] = -1;
  negative.back() += 2;
  raises([&] { dist::all_to_all_single(out, in, ones_each, negative); }, {"negative"});
  raises([&] { dist::all_to_all_single(zeros({n, 3}), in, ones_each, ones_each); }, {"differ beyond dim 0"});
  raises([&] { dist::all_to_all_single(zeros({n, 2}, TensorOptions(kInt32)), in, ones_each, ones_each); },
         {"int32"});
  raises([&] { dist::all_to_all_single(zeros({n + 1, 2}), in, std::vector<int64_t>{}, ones_each); },
         {"equal parts"});
  raises([&] { dist::all_to_all_single(out, zeros({}), ones_each, ones_each); }, {"dim 0"});
  std::vector<Tensor> list(static_cast<size_t>(n), zeros({2}));
  std::vector<Tensor> mixed = list;
  mixed.back() = zeros({2}, TensorOptions(kFloat64));
  raises([&] { dist::all_to_all(list, mixed); }, {"[all_to_all]", "float64"});
}

// Rank 0 sends rank 1 one row more than rank 1 expects: only rank 1 could see it locally, yet
// every rank raises the same error; so does a mistake one rank makes alone; the group goes on.
TEST(AllToAllUneven, SizesThatDisagreeAcrossRanksRaiseOnEveryRank) {
  auto pg = group();
  const int r = pg->rank(), n = pg->size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<int64_t> in_splits(static_cast<size_t>(n), 1), out_splits(static_cast<size_t>(n), 1);
  if (r == 0) in_splits[1] = 2;
  Tensor in = zeros({std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0}), 2});
  Tensor out = zeros({n, 2});
  EXPECT_TRUE(testing::throws_with([&] { dist::all_to_all_single(out, in, out_splits, in_splits); },
                                   {"rank 0 sends 2 rows to rank 1, which expects 1", "disagree"}));
  std::vector<Tensor> inputs, outputs;
  for (int k = 0; k < n; ++k) {
    inputs.push_back(zeros({r == 0 && k == 1 ? 3 : 2}));
    outputs.push_back(zeros({2}));
  }
  EXPECT_TRUE(testing::throws_with([&] { dist::all_to_all(outputs, inputs); },
                                   {"rank 0 sends 3 elements to rank 1, which expects 2"}));
  // a mistake only the last rank makes and sees: it raises its error, every other rank names it
  const bool odd_one = r == n - 1;
  const std::string failed = fmt::format("rank {} raised", n - 1);
  std::vector<int64_t> wrong_sum(static_cast<size_t>(n), 1);
  if (odd_one) wrong_sum[0] = 2;
  EXPECT_TRUE(testing::throws_with([&] { dist::all_to_all_single(out, zeros({n, 2}), out_splits, wrong_sum); },
                                   {"[all_to_all_single]", odd_one ? "input split sizes sum to" : failed.c_str()}));
  std::vector<Tensor> sent, mixed;
  for (int k = 0; k < n; ++k) {
    sent.push_back(zeros({2}));
    mixed.push_back(zeros({2}, TensorOptions(odd_one && k == n - 1 ? kFloat64 : kFloat32)));
  }
  EXPECT_TRUE(testing::throws_with([&] { dist::all_to_all(mixed, sent); },
                                   {"[all_to_all]", odd_one ? "float64" : failed.c_str()}));
  Tensor one = ones({2}, TensorOptions(kInt32));
  dist::all_reduce(one);
  EXPECT_EQ(values(one), std::vector<double>(2, n));
}

}  // namespace
}  // namespace strata
