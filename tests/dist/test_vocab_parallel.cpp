// Vocabulary parallelism under mpirun (2 and 4 ranks, float64): VocabParallelEmbedding against the
// whole nn::Embedding built from the same seed, vocab_parallel_cross_entropy against
// nn::functional::cross_entropy of the whole logits every rank also holds, and bad arguments (on
// one rank or all) raising on every rank, the group working afterwards.
#include <string>

#include "dist/dist_testing.h"

namespace strata {
namespace {

using testing::throws_with;

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_TRUE(allclose(got, want, 1e-12, 1e-13)) << what;
}

// A vocabulary that does not divide by the group size: the ranks hold 4 or 5 rows.
int64_t uneven_vocab(int n) { return 4 * n + 3; }

TEST(VocabRange, SplitsWithTheRemainderOnTheFirstRanks) {
  const dist::VocabRange r0 = dist::vocab_range(11, 0, 4), r3 = dist::vocab_range(11, 3, 4);
  EXPECT_EQ(r0.start, 0);
  EXPECT_EQ(r0.end, 3);
  EXPECT_EQ(dist::vocab_range(11, 2, 4).start, 6);
  EXPECT_EQ(dist::vocab_range(11, 2, 4).end, 9);
  EXPECT_EQ(r3.start, 9);
  EXPECT_EQ(r3.end, 11);
  for (int n = 1; n <= 5; ++n) {  // contiguous, covering, sizes differing by one at most
    int64_t next = 0;
    for (int r = 0; r < n; ++r) {
      const dist::VocabRange v = dist::vocab_range(13, r, n);
      EXPECT_EQ(v.start, next);
      EXPECT_TRUE(v.size() == 13 / n || v.size() == 13 / n + 1);
      next = v.end;
    }
    EXPECT_EQ(next, 13);
  }
  EXPECT_TRUE(throws_with([] { dist::vocab_range(3, 0, 4); }, {"vocab_range", "3 entries", "4 ranks"}));
  EXPECT_TRUE(throws_with([] { dist::vocab_range(8, 4, 4); }, {"vocab_range", "rank 4"}));
}

// Every shard's first and last row, row 0 and the last, repeated ids, the padding row.
Tensor boundary_ids(int64_t vocab, int n, int64_t padding) {
  std::vector<int64_t> ids{0, vocab - 1, padding, 2, 2};
  for (int r = 0; r < n; ++r) {
    const dist::VocabRange v = dist::vocab_range(vocab, r, n);
    ids.push_back(v.start);
    ids.push_back(v.end - 1);
  }
  while (ids.size() % 3 != 0) ids.push_back(vocab / 2);
  return from_vector(ids).view({3, -1});
}

TEST(VocabParallelEmbedding, EqualsTheWholeEmbeddingAndItsSlice) {
  auto pg = dist_testing::group();
  const int n = pg->size(), rank = pg->rank();
  const int64_t vocab = uneven_vocab(n), dim = 5;
  const int64_t padding = dist::vocab_range(vocab, n - 1, n).start;  // a shard's first row
  Generator g1(7), g2(7);
  nn::Embedding whole(vocab, dim, {.padding_idx = padding, .generator = &g1});
  dist::VocabParallelEmbedding emb(vocab, dim, nullptr, {.padding_idx = padding, .generator = &g2});
  whole.to(kFloat64);
  emb.to(kFloat64);
  const dist::VocabRange mine = dist::vocab_range(vocab, rank, n);
  EXPECT_EQ(emb.range.start, mine.start);
  EXPECT_EQ(emb.range.end, mine.end);
  ASSERT_EQ(emb.weight.shape(), (Shape{mine.size(), dim}));
  EXPECT_TRUE(equal(emb.weight, whole.weight.detach().narrow(0, mine.start, mine.size())));
  EXPECT_TRUE(equal(emb.full_weight(), whole.weight.detach()));
  EXPECT_EQ(*emb.padding_idx, padding);

  const Tensor ids = boundary_ids(vocab, n, padding);
  const Tensor y = emb(ids), y_ref = whole(ids);
  expect_close(y, y_ref, "output");
  const Tensor w = sin(arange(y.numel(), TensorOptions(kFloat64))).view(y.shape());
  (y * w).sum().backward();
  (y_ref * w).sum().backward();
  expect_close(emb.weight.grad(), whole.weight.grad().narrow(0, mine.start, mine.size()), "weight gradient");
  if (mine.start <= padding && padding < mine.end)
    EXPECT_TRUE(equal(emb.weight.grad().select(0, padding - mine.start), zeros({dim}, TensorOptions(kFloat64))));
  // int32 ids, and a table loaded whole from another one
  Generator g3(99);
  dist::VocabParallelEmbedding loaded(vocab, dim, nullptr, {.generator = &g3});
  loaded.to(kFloat64);
  loaded.load_full_weight(whole.weight);
  expect_close(loaded(ids.to(kInt32)), y_ref, "int32 ids through a loaded table");
}

TEST(VocabParallelEmbedding, BadIdsRaiseOnEveryRank) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  const bool last = pg->rank() == n - 1;
  const int64_t vocab = uneven_vocab(n);
  dist::VocabParallelEmbedding emb(vocab, 3);
  EXPECT_TRUE(throws_with([&] { emb(from_vector<int64_t>({1, vocab})); }, {"VocabParallelEmbedding", "out of range"}));
  EXPECT_TRUE(throws_with([&] { emb(from_vector<int64_t>({-1, 0})); }, {"index -1", "out of range"}));
  EXPECT_TRUE(throws_with([&] { emb(from_vector<double>({1, 2})); }, {"int64 or int32"}));
  // mistakes on the last rank alone: its own error there, one naming it elsewhere
  const char* named = last ? "out of range" : "raised on its arguments";
  EXPECT_TRUE(throws_with([&] { emb(from_vector<int64_t>({1, last ? vocab + 2 : 2})); }, {named}));
  EXPECT_TRUE(throws_with([&] { emb(from_vector<int64_t>({1, last ? 3 : 2})); }, {"disagree", "sum of the indices"}));
  EXPECT_TRUE(throws_with([&] { emb(zeros({last ? 3 : 2}, TensorOptions(kInt64))); }, {"disagree", "shape"}));
  dist::VocabParallelEmbedding other_dim(vocab, last ? 4 : 3);
  EXPECT_TRUE(throws_with([&] { other_dim(from_vector<int64_t>({1})); }, {"disagree", "embedding_dim"}));
  EXPECT_TRUE(throws_with([] { dist::VocabParallelEmbedding(1, 3); }, {"cannot give each"}));
  EXPECT_TRUE(throws_with([&] { emb.load_full_weight(zeros({vocab + 1, 3})); }, {"load_full_weight", "whole table"}));
  // the group still works
  EXPECT_EQ(emb(from_vector<int64_t>({0, vocab - 1})).shape(), (Shape{2, 3}));
}

struct CrossEntropyCase {
  const char* reduction;
  int64_t ignore_index;
  double label_smoothing;
};

// Whole logits (2, 5, V) the same on every rank, shifted where exp overflows float64 (so only a
// stable form works), and targets
// with every shard's boundary classes and, where `ignored`, ignore_index.
struct Problem {
  Tensor logits, target;
};
Problem problem(int64_t vocab, int n, int64_t ignore_index, bool ignored) {
  Generator gen(3);
  Problem p{randn({2, 5, vocab}, TensorOptions(kFloat64), &gen) * 4 + 1000, Tensor()};
  std::vector<int64_t> t{0, vocab - 1};
  for (int r = 0; r < n; ++r) {
    t.push_back(dist::vocab_range(vocab, r, n).start);
    t.push_back(dist::vocab_range(vocab, r, n).end - 1);
  }
  for (size_t k = 0; t.size() < 10; ++k) t.push_back(ignored && k % 2 == 0 ? ignore_index : (3 * k + 1) % vocab);
  t.resize(10);
  if (ignored) t[4] = ignore_index;
  p.target = from_vector(t).view({2, 5});
  return p;
}

TEST(VocabParallelCrossEntropy, EqualsTheWholeCrossEntropy) {
  auto pg = dist_testing::group();
  const int n = pg->size(), rank = pg->rank();
  const int64_t vocab = uneven_vocab(n);
  const dist::VocabRange mine = dist::vocab_range(vocab, rank, n);
  for (const char* red : {"none", "mean", "sum"}) {
    for (const CrossEntropyCase c : {CrossEntropyCase{red, -100, 0}, CrossEntropyCase{red, 2, 0},
                                     CrossEntropyCase{red, -100, 0.1}, CrossEntropyCase{red, 1, 0.25}}) {
      const std::string what = fmt::format("{} ignore_index {} label_smoothing {}", red, c.ignore_index,
                                           c.label_smoothing);
      const Problem p = problem(vocab, n, c.ignore_index, c.ignore_index >= 0);
      Tensor whole = p.logits.clone().requires_grad_();
      Tensor shard = p.logits.narrow(-1, mine.start, mine.size()).clone().requires_grad_();
      const Tensor loss = dist::vocab_parallel_cross_entropy(
          shard, p.target, nullptr,
          {.ignore_index = c.ignore_index, .reduction = red, .label_smoothing = c.label_smoothing});
      Tensor ref = nn::functional::cross_entropy(
          whole.view({-1, vocab}), p.target.view({-1}),
          {.ignore_index = c.ignore_index, .reduction = red, .label_smoothing = c.label_smoothing});
      if (std::string(red) == "none") ref = ref.view({2, 5});
      expect_close(loss, ref, what + ": loss");
      const Tensor w = cos(arange(loss.numel(), TensorOptions(kFloat64))).view(loss.shape());
      (loss * w).sum().backward();
      (ref * w).sum().backward();
      expect_close(shard.grad(), whole.grad().narrow(-1, mine.start, mine.size()), what + ": logits gradient");
    }
  }
}

TEST(VocabParallelCrossEntropy, EveryTargetIgnoredGivesNanWithAZeroGradient) {
  auto pg = dist_testing::group();
  const dist::VocabRange mine = dist::vocab_range(uneven_vocab(pg->size()), pg->rank(), pg->size());
  Tensor shard = randn({3, mine.size()}, TensorOptions(kFloat64)).requires_grad_();
  const Tensor target = full({3}, -100, TensorOptions(kInt64));
  const Tensor loss = dist::vocab_parallel_cross_entropy(shard, target);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_TRUE(equal(shard.grad(), zeros_like(shard)));
  EXPECT_EQ(dist::vocab_parallel_cross_entropy(shard, target, nullptr, {.reduction = "sum"}).item<double>(), 0.0);
}

TEST(VocabParallel, EmptyBatches) {
  auto pg = dist_testing::group();
  const int64_t vocab = uneven_vocab(pg->size());
  dist::VocabParallelEmbedding emb(vocab, 3);
  EXPECT_EQ(emb(zeros({0, 4}, TensorOptions(kInt64))).shape(), (Shape{0, 4, 3}));
  const Tensor shard = zeros({0, emb.range.size()}, TensorOptions(kFloat64));
  const Tensor none = zeros({0}, TensorOptions(kInt64));
  EXPECT_TRUE(std::isnan(dist::vocab_parallel_cross_entropy(shard, none).item<double>()));  // nn's mean of nothing
  EXPECT_EQ(dist::vocab_parallel_cross_entropy(shard, none, nullptr, {.reduction = "sum"}).item<double>(), 0.0);
  EXPECT_EQ(dist::vocab_parallel_cross_entropy(shard, none, nullptr, {.reduction = "none"}).shape(), (Shape{0}));
}

TEST(VocabParallelCrossEntropy, AutocastComputesInFloat32) {
  auto pg = dist_testing::group();
  const dist::VocabRange mine = dist::vocab_range(uneven_vocab(pg->size()), pg->rank(), pg->size());
  Generator gen(4);
  Tensor shard = randn({6, mine.size()}, TensorOptions(kFloat32), &gen).to(kBFloat16).requires_grad_();
  const Tensor target = from_vector<int64_t>({0, 1, 2, 3, 4, 5});
  Tensor loss;
  {
    amp::Autocast ac(kBFloat16);
    loss = dist::vocab_parallel_cross_entropy(shard, target);
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  EXPECT_TRUE(equal(loss, dist::vocab_parallel_cross_entropy(shard.detach().to(kFloat32), target)));
  loss.backward();
  EXPECT_EQ(shard.grad().dtype(), kBFloat16);
}

TEST(VocabParallelCrossEntropy, BadArgumentsRaiseOnEveryRank) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  const bool last = pg->rank() == n - 1;
  const int64_t vocab = uneven_vocab(n);
  const Tensor shard = zeros({4, dist::vocab_range(vocab, pg->rank(), n).size()}, TensorOptions(kFloat64));
  const Tensor ok = from_vector<int64_t>({0, 1, 2, 3});
  auto ce = [&](const Tensor& logits, const Tensor& target, dist::VocabParallelCrossEntropyOptions o = {}) {
    return dist::vocab_parallel_cross_entropy(logits, target, nullptr, o);
  };
  EXPECT_TRUE(throws_with([&] { ce(shard, from_vector<int64_t>({0, 1, vocab, 3})); },
                          {"vocab_parallel_cross_entropy", "out of range", "classes"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, from_vector<int64_t>({0, -2, 1, 3})); }, {"index -2", "out of range"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, from_vector<int64_t>({0, 1, 2})); }, {"target of shape", "does not match"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok, {.reduction = "avg"}); }, {"reduction"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok, {.label_smoothing = 1.5}); }, {"label_smoothing"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok.to(kFloat64)); }, {"class indices"}));
  // mistakes on the last rank alone, and arguments that differ across ranks
  const char* named = last ? "does not match" : "raised on its arguments";
  EXPECT_TRUE(throws_with([&] { ce(last ? shard.narrow(0, 0, 3) : shard, ok); }, {named}));
  EXPECT_TRUE(throws_with([&] { ce(shard.narrow(0, 0, last ? 3 : 4), ok.narrow(0, 0, last ? 3 : 4)); },
                          {"disagree", "shape of the target"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, last ? from_vector<int64_t>({0, 1, 2, 4}) : ok); },
                          {"disagree", "sum of the targets"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok, {.ignore_index = last ? 0 : -100}); }, {"disagree", "ignore_index"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok, {.reduction = last ? "sum" : "mean"}); }, {"disagree", "reduction"}));
  EXPECT_TRUE(throws_with([&] { ce(shard, ok, {.label_smoothing = last ? 0.1 : 0}); }, {"label_smoothing"}));
  EXPECT_TRUE(throws_with([&] { ce(last ? shard.to(kFloat32) : shard, ok); }, {"disagree", "logits dtype"}));
  // the group still works: uniform logits give log V
  EXPECT_NEAR(ce(shard, ok).item<double>(), std::log(static_cast<double>(vocab)), 1e-14);
}

}  // namespace
}  // namespace strata
