// The token shards the example trains on (written by strata-tokenize, one token per byte):
// the vocabulary they need, the unigram baseline a model must beat, and the top-k sampling
// used to generate text from the trained model.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include <strata/strata.hpp>

namespace corpus {

namespace st = strata;

// Calls f(token) for every token of `shard`, reading it in chunks.
template <class F>
void for_each_token(const st::data::TokenShard& shard, F f) {
  std::vector<int64_t> chunk(1 << 16);
  for (int64_t at = 0; at < shard.size(); at += static_cast<int64_t>(chunk.size())) {
    int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), shard.size() - at);
    shard.read(at, n, chunk.data());
    for (int64_t i = 0; i < n; ++i) f(chunk[i]);
  }
}

// The vocabulary the shards need: 256 bytes, or more when they hold larger ids (an
// end-of-text token, for instance).
inline int64_t vocab_size(const st::data::TokenShard& train, const st::data::TokenShard& val) {
  int64_t top = 255;
  for (const auto* s : {&train, &val}) for_each_token(*s, [&](int64_t t) { top = std::max(top, t); });
  return top + 1;
}

// Cross-entropy on the validation tokens of the training tokens' frequencies (add-one
// smoothed): the loss of the best model that ignores context.
inline double unigram_entropy(const st::data::TokenShard& train, const st::data::TokenShard& val, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);
  for_each_token(train, [&](int64_t t) { counts[static_cast<size_t>(t)] += 1; });
  double total = 0;
  for (double c : counts) total += c;
  double nll = 0;
  for_each_token(val, [&](int64_t t) { nll -= std::log(counts[static_cast<size_t>(t)] / total); });
  return nll / static_cast<double>(std::max<int64_t>(1, val.size()));
}

inline std::vector<double> to_vector(const st::Tensor& t) {
  st::Tensor c = t.contiguous().to(st::kFloat64);
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Samples an index among the k largest logits, proportionally to softmax(logits / temperature)
// (temperature > 0). The largest logit is subtracted before the division, so a tiny temperature
// gives the most likely token instead of overflowing.
inline int64_t sample_top_k(const std::vector<double>& logits, double temperature, int64_t k, st::Generator& g) {
  std::vector<int64_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  k = std::clamp<int64_t>(k, 1, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  double top = logits[order[0]], total = 0;
  std::vector<double> w(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) total += (w[i] = std::exp((logits[order[i]] - top) / temperature));
  double u = st::rand({1}, st::kFloat64, &g).item<double>() * total;
  for (int64_t i = 0; i < k; ++i) {
    if ((u -= w[i]) <= 0) return order[i];
  }
  return order[k - 1];
}

}  // namespace corpus
