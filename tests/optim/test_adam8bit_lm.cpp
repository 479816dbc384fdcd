// 8-bit Adam against fp32 AdamW on a small Transformer language model: the same model, data
// and hyperparameters, 300 steps each; the 8-bit run's loss must stay within 2% of AdamW's.
#include <array>
#include <cmath>
#include <random>

#include "optim/optim_testing.h"

namespace strata {
namespace {

constexpr int64_t kVocab = 32, kDim = 64, kContext = 32, kBatch = 16;

// Sequences from a fixed random bigram table in which each token has three likely
// successors, so a model can bring the loss from ln 32 = 3.47 towards the table's entropy.
class BigramSource {
 public:
  explicit BigramSource(uint32_t seed) : rng_(seed) {
    std::uniform_int_distribution<int> tok(0, kVocab - 1);
    for (auto& s : next_) s = {tok(rng_), tok(rng_), tok(rng_)};
  }
  // (inputs, targets), each (kBatch, kContext) int64.
  std::pair<Tensor, Tensor> batch() {
    std::vector<int64_t> seq(static_cast<size_t>(kBatch * (kContext + 1)));
    std::uniform_int_distribution<int> tok(0, kVocab - 1), pick(0, 9);
    for (int64_t b = 0; b < kBatch; ++b) {
      int64_t t = tok(rng_);
      for (int64_t i = 0; i <= kContext; ++i) {
        seq[static_cast<size_t>(b * (kContext + 1) + i)] = t;
        const int p = pick(rng_);  // 50%, 30%, 10% to the likely successors, 10% anywhere
        t = p < 5 ? next_[t][0] : p < 8 ? next_[t][1] : p < 9 ? next_[t][2] : tok(rng_);
      }
    }
    Tensor all = from_vector(seq, Shape{kBatch, kContext + 1});
    return {all.narrow(1, 0, kContext).contiguous(), all.narrow(1, 1, kContext).contiguous()};
  }

 private:
  std::mt19937 rng_;
  std::array<std::array<int, 3>, kVocab> next_;
};

// Token and position embeddings, two pre-norm causal encoder layers, a final LayerNorm and
// an output projection. Its large weights (attention in/out, feed-forward) have 4096 or more
// elements, so 8-bit Adam quantizes their moments.
struct TinyLM : nn::Module {
  explicit TinyLM(Generator& g)
      : tok(kVocab, kDim, {.generator = &g}),
        pos(kContext, kDim, {.generator = &g}),
        block1(kDim, 4, options(g)),
        block2(kDim, 4, options(g)),
        norm(kDim),
        head(kDim, kVocab, {.generator = &g}) {
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("block1", block1);
    register_module("block2", block2);
    register_module("norm", norm);
    register_module("head", head);
  }
  static nn::TransformerEncoderLayerOptions options(Generator& g) {
    return {.dim_feedforward = 256, .dropout = 0, .activation = "gelu", .batch_first = true, .norm_first = true,
            .generator = &g};
  }
  Tensor forward(const Tensor& idx) override {
    Tensor x = tok(idx) + pos(arange(kContext, TensorOptions(kInt64)));
    x = block1.forward(x, Tensor(), Tensor(), true);
    x = block2.forward(x, Tensor(), Tensor(), true);
    return head(norm(x));
  }
  std::string name() const override { return "TinyLM"; }
  nn::Embedding tok, pos;
  nn::TransformerEncoderLayer block1, block2;
  nn::LayerNorm norm;
  nn::Linear head;
};

// The loss of every step of a 300-step run.
template <class Opt, class Options>
std::vector<double> train(Options options) {
  Generator init(7);
  TinyLM model(init);
  Opt opt(model.parameters(), options);
  BigramSource data(11);
  std::vector<double> losses;
  for (int step = 0; step < 300; ++step) {
    auto [x, y] = data.batch();
    Tensor logits = model(x);
    Tensor loss = nn::functional::cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
    losses.push_back(loss.item<double>());
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return losses;
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

TEST(Adam8bit, SmallTransformerLossWithinTwoPercentOfAdamW) {
  const double lr = 2e-3, wd = 0.01;
  std::vector<double> l32 = train<optim::AdamW>(optim::AdamWOptions{.lr = lr, .weight_decay = wd});
  std::vector<double> l8 = train<optim::Adam8bit>(optim::Adam8bitOptions{.lr = lr, .weight_decay = wd});
  ASSERT_EQ(l8[0], l32[0]);  // same model, same first batch
  const double end32 = mean_of_last(l32, 20), end8 = mean_of_last(l8, 20);
  RecordProperty("adamw_final_loss", std::to_string(end32));
  RecordProperty("adam8bit_final_loss", std::to_string(end8));
  EXPECT_LT(end32, 0.6 * l32[0]);  // the model learned: the comparison means something
  EXPECT_LE(std::fabs(end8 - end32), 0.02 * end32) << "AdamW " << end32 << ", Adam8bit " << end8;
  // and along the way, every 50 steps (means over 20 steps, past the first 50)
  for (size_t at = 100; at <= 300; at += 50) {
    std::vector<double> a(l32.begin(), l32.begin() + at), b(l8.begin(), l8.begin() + at);
    EXPECT_LE(std::fabs(mean_of_last(b, 20) - mean_of_last(a, 20)), 0.02 * mean_of_last(a, 20)) << "step " << at;
  }
}

}  // namespace
}  // namespace strata
