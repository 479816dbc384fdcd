// Samplers (permutations, reproducibility, distributed shares), the tensor-backed datasets
// and LoaderState's key/value form.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>

#include "testing.h"

namespace st = strata;
namespace sd = strata::data;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace

TEST(Samplers, RandomPermutationIsAPermutation) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    for (int64_t epoch : {0, 1, 5}) {
      auto p = sd::random_permutation(n, 42, epoch);
      std::sort(p.begin(), p.end());
      EXPECT_EQ(p, iota(n)) << "n=" << n << " epoch=" << epoch;
    }
  }
}

TEST(Samplers, RandomSamplerReproducibleAndFreshPerEpoch) {
  sd::RandomSampler a(100, 7), b(100, 7), c(100, 8);
  EXPECT_EQ(a.indices(3), b.indices(3));   // same (seed, epoch)
  EXPECT_NE(a.indices(3), a.indices(4));   // new permutation per epoch
  EXPECT_NE(a.indices(3), c.indices(3));   // another seed
  EXPECT_NE(a.indices(0), iota(100));
  EXPECT_EQ(a.size(), 100);
}

TEST(Samplers, RandomPermutationIsUniform) {
  // Each element lands in each of 4 positions with probability 1/4; over 4000 epochs the
  // counts are Binomial(4000, 1/4): mean 1000, sd 27. A biased shuffle (e.g. Sattolo's, which
  // never leaves an element in place) fails this by far.
  const int64_t n = 4, epochs = 4000;
  std::vector<int64_t> counts(n * n, 0);
  for (int64_t e = 0; e < epochs; ++e) {
    auto p = sd::random_permutation(n, 123, e);
    for (int64_t pos = 0; pos < n; ++pos) ++counts[p[pos] * n + pos];
  }
  for (int64_t c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(Samplers, Sequential) {
  sd::SequentialSampler s(5);
  EXPECT_EQ(s.indices(0), iota(5));
  EXPECT_EQ(s.indices(9), iota(5));
  EXPECT_THROW(sd::SequentialSampler(-1), st::Error);
}

TEST(Samplers, DistributedMatchesPyTorchLayout) {
  // PyTorch's DistributedSampler(shuffle=False) on 5 samples, 2 ranks: order [0,1,2,3,4] is
  // padded to [0,1,2,3,4,0]; rank r takes every 2nd from r. With drop_last it is cut to 4.
  sd::DistributedSamplerOptions plain{.shuffle = false};
  EXPECT_EQ(sd::DistributedSampler(5, 0, 2, plain).indices(0), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(sd::DistributedSampler(5, 1, 2, plain).indices(0), (std::vector<int64_t>{1, 3, 0}));
  sd::DistributedSamplerOptions drop{.shuffle = false, .drop_last = true};
  EXPECT_EQ(sd::DistributedSampler(5, 0, 2, drop).indices(0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(sd::DistributedSampler(5, 1, 2, drop).indices(0), (std::vector<int64_t>{1, 3}));
  // More ranks than samples: padding wraps around more than once.
  for (int64_t r = 0; r < 5; ++r)
    EXPECT_EQ(sd::DistributedSampler(2, r, 5, plain).indices(0), (std::vector<int64_t>{r % 2}));
}

TEST(Samplers, DistributedSharesDisjointAndCovering) {
  for (bool drop_last : {false, true}) {
    for (int64_t n : {12, 10, 7}) {
      const int64_t world = 4;
      for (int64_t epoch : {0, 1}) {
        std::vector<int64_t> all;
        int64_t per_rank = -1;
        for (int64_t r = 0; r < world; ++r) {
          sd::DistributedSampler s(n, r, world, {.shuffle = true, .seed = 9, .drop_last = drop_last});
          auto mine = s.indices(epoch);
          EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size());
          if (per_rank >= 0) EXPECT_EQ(s.size(), per_rank) << "every rank gets the same count";
          per_rank = s.size();
          all.insert(all.end(), mine.begin(), mine.end());
        }
        std::set<int64_t> distinct(all.begin(), all.end());
        if (drop_last) {
          EXPECT_EQ(per_rank, n / world);
          EXPECT_EQ(distinct.size(), all.size()) << "no sample twice";
        } else {
          EXPECT_EQ(per_rank, (n + world - 1) / world);
          EXPECT_EQ(static_cast<int64_t>(distinct.size()), n) << "every sample covered";
          EXPECT_EQ(static_cast<int64_t>(all.size()) - n, per_rank * world - n) << "only the padding repeats";
        }
        for (int64_t i : all) EXPECT_TRUE(i >= 0 && i < n);
      }
    }
  }
  sd::DistributedSampler a(50, 1, 3, {.seed = 4}), b(50, 1, 3, {.seed = 4});
  EXPECT_EQ(a.indices(2), b.indices(2));
  EXPECT_NE(a.indices(2), a.indices(3));
  EXPECT_THROW(sd::DistributedSampler(10, 3, 3), st::Error);
  EXPECT_THROW(sd::DistributedSampler(10, 0, 0), st::Error);
}

TEST(Datasets, TensorDatasetRows) {
  st::Tensor x = st::arange(12, st::TensorOptions(st::kFloat32)).view({4, 3});
  st::Tensor y = st::from_vector<int64_t>({10, 11, 12, 13});
  auto ds = std::make_shared<sd::TensorDataset>(x, y);
  EXPECT_EQ(ds->size(), 4);
  sd::Example e = ds->get(2);
  EXPECT_EQ(st::testing::values(e.input), (std::vector<double>{6, 7, 8}));
  EXPECT_EQ(e.target.item<int64_t>(), 12);
  EXPECT_THROW(ds->get(4), st::Error);
  EXPECT_THROW(ds->get(-1), st::Error);
  EXPECT_THROW(sd::TensorDataset(x, st::zeros({3})), st::Error);

  sd::Subset<sd::Example> sub(ds, {3, 0});
  EXPECT_EQ(sub.size(), 2);
  EXPECT_EQ(sub.get(0).target.item<int64_t>(), 13);
  EXPECT_EQ(sub.get(1).target.item<int64_t>(), 10);
  EXPECT_THROW(sd::Subset<sd::Example>(ds, {4}), st::Error);

  auto ds2 = std::make_shared<sd::TensorDataset>(st::zeros({2, 3}), st::from_vector<int64_t>({20, 21}));
  sd::ConcatDataset<sd::Example> cat({ds, ds2});
  EXPECT_EQ(cat.size(), 6);
  std::vector<int64_t> got;
  for (int64_t i = 0; i < cat.size(); ++i) got.push_back(cat.get(i).target.item<int64_t>());
  EXPECT_EQ(got, (std::vector<int64_t>{10, 11, 12, 13, 20, 21}));
  EXPECT_THROW(cat.get(6), st::Error);

  sd::TensorListDataset list({x, y, st::arange(4)});
  auto row = list.get(1);
  ASSERT_EQ(row.size(), 3u);
  EXPECT_EQ(st::testing::values(row[0]), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(row[2].item<int64_t>(), 1);
}

TEST(LoaderState, MapRoundTrip) {
  sd::LoaderState s{3, 17, 0xfedcba9876543210ull};
  auto m = s.to_map();
  EXPECT_EQ(m.at("epoch"), 3);
  EXPECT_EQ(m.at("batches"), 17);
  EXPECT_EQ(sd::LoaderState::from_map(m), s);
  m.erase("batches");
  try {
    sd::LoaderState::from_map(m);
    FAIL() << "a missing key must raise";
  } catch (const st::Error& e) {
    EXPECT_NE(std::string(e.what()).find("batches"), std::string::npos) << e.what();
  }
}

TEST(Samplers, DistributedWorldSizesUpToInt64Max) {
  // ceil(10 / INT64_MAX) is 1: every rank gets one index, the order repeating.
  sd::DistributedSamplerOptions plain{.shuffle = false};
  sd::DistributedSampler huge(10, 0, INT64_MAX, plain);
  EXPECT_EQ(huge.size(), 1);
  EXPECT_EQ(huge.indices(0), (std::vector<int64_t>{0}));
  EXPECT_EQ(sd::DistributedSampler(10, INT64_MAX - 1, INT64_MAX, plain).indices(0),
            (std::vector<int64_t>{(INT64_MAX - 1) % 10}));
  // 2^40 ranks over 10 samples: the padded order is not built (it would hold 2^40 entries).
  const int64_t world = int64_t{1} << 40;
  EXPECT_EQ(sd::DistributedSampler(10, 5, world, plain).indices(0), (std::vector<int64_t>{5}));
  EXPECT_EQ(sd::DistributedSampler(10, 12, world, plain).indices(0), (std::vector<int64_t>{2}));
  sd::DistributedSampler shuffled(10, 13, world, {.seed = 3});
  EXPECT_EQ(shuffled.indices(4), (std::vector<int64_t>{sd::random_permutation(10, 3, 4)[3]}));
  EXPECT_EQ(sd::DistributedSampler(10, 5, world, {.drop_last = true}).size(), 0);
  EXPECT_TRUE(sd::DistributedSampler(10, 5, world, {.drop_last = true}).indices(0).empty());
  EXPECT_TRUE(sd::DistributedSampler(0, 5, world).indices(0).empty());
  // A dataset of n near INT64_MAX: only the sizes, nothing is materialized.
  EXPECT_EQ(sd::DistributedSampler(INT64_MAX, 0, 2).size(), INT64_MAX / 2 + 1);
  EXPECT_EQ(sd::DistributedSampler(INT64_MAX, 0, INT64_MAX).size(), 1);
}

TEST(LoaderState, OptionalKeys) {
  sd::LoaderState s{3, 17, 5};
  s.dataset_size = 100;
  s.samples = 50;
  s.batch_size = 8;
  s.shuffle = true;
  s.drop_last = false;
  auto m = s.to_map();
  EXPECT_EQ(m.at("dataset_size"), 100);
  EXPECT_EQ(m.at("samples"), 50);
  EXPECT_EQ(m.at("batch_size"), 8);
  EXPECT_EQ(m.at("shuffle"), 1);
  EXPECT_EQ(m.at("drop_last"), 0);
  EXPECT_EQ(sd::LoaderState::from_map(m), s);
  // A map from a checkpoint written before these keys existed: they stay unset.
  std::map<std::string, int64_t> old{{"epoch", 3}, {"batches", 17}, {"seed", 5}};
  sd::LoaderState o = sd::LoaderState::from_map(old);
  EXPECT_EQ(o, (sd::LoaderState{3, 17, 5}));
  EXPECT_FALSE(o.dataset_size || o.samples || o.batch_size || o.shuffle || o.drop_last);
  EXPECT_EQ(o.to_map(), old);
  for (auto [key, bad] : std::vector<std::pair<std::string, int64_t>>{
           {"dataset_size", -1}, {"samples", -2}, {"batch_size", 0}, {"shuffle", 2}, {"drop_last", -1}}) {
    auto broken = m;
    broken[key] = bad;
    EXPECT_TRUE(st::testing::throws_with([&] { sd::LoaderState::from_map(broken); }, {key.c_str()}))
        << key << " = " << bad;
  }
}
