// A small GPT-like language model under mpirun (2 and 4 ranks, float64): a vocabulary-parallel
// token embedding tied to the output projection, a replicated position embedding, a Megatron
// MLP (column then row parallel) and the vocabulary-parallel cross entropy, trained with SGD,
// follows the same model built whole in one process from the same seeds, step for step.
#include "dist/dist_testing.h"

namespace strata {
namespace {

constexpr int64_t kDim = 6, kSeq = 5;

// h = tok(ids) + pos; h + fc2(tanh(fc1(h))); logits = h tok^T (tied).
struct WholeLm : nn::Module {
  WholeLm(int64_t vocab, int64_t hidden, Generator* g)
      : tok(vocab, kDim, {.generator = &g[0]}), pos(kSeq, kDim, {.generator = &g[1]}),
        fc1(kDim, hidden, {.generator = &g[2]}), fc2(hidden, kDim, {.generator = &g[3]}) {
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor loss(const Tensor& ids, const Tensor& target) {
    Tensor h = tok(ids) + pos(arange(kSeq, TensorOptions(kInt64)));
    h = h + fc2(tanh(fc1(h)));
    const Tensor logits = linear(h, tok.weight);  // (B, T, V)
    return nn::functional::cross_entropy(logits.view({-1, tok.num_embeddings}), target.view({-1}),
                                         {.ignore_index = 0, .label_smoothing = 0.05});
  }
  nn::Embedding tok, pos;
  nn::Linear fc1, fc2;
};

struct ParallelLm : nn::Module {
  ParallelLm(int64_t vocab, int64_t hidden, Generator* g)
      : tok(vocab, kDim, nullptr, {.generator = &g[0]}), pos(kSeq, kDim, {.generator = &g[1]}),
        fc1(kDim, hidden, nullptr, {.gather_output = false, .generator = &g[2]}),
        fc2(hidden, kDim, nullptr, {.input_is_parallel = true, .generator = &g[3]}) {
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor loss(const Tensor& ids, const Tensor& target) {
    Tensor h = tok(ids) + pos(arange(kSeq, TensorOptions(kInt64)));
    h = h + fc2(tanh(fc1(h)));
    const Tensor logits = linear(dist::copy_to_tensor_parallel_region(h), tok.weight);  // (B, T, this rank's V)
    return dist::vocab_parallel_cross_entropy(logits, target, nullptr, {.ignore_index = 0, .label_smoothing = 0.05});
  }
  dist::VocabParallelEmbedding tok;
  nn::Embedding pos;
  dist::ColumnParallelLinear fc1;
  dist::RowParallelLinear fc2;
};

TEST(VocabParallelGpt, TrainsAsTheWholeModel) {
  auto pg = dist_testing::group();
  const int n = pg->size(), rank = pg->rank();
  const int64_t vocab = 4 * n + 3, hidden = 2 * n;  // uneven vocabulary shards
  Generator g[4] = {Generator(1), Generator(2), Generator(3), Generator(4)};
  Generator h[4] = {Generator(1), Generator(2), Generator(3), Generator(4)};
  WholeLm whole(vocab, hidden, g);
  ParallelLm par(vocab, hidden, h);
  whole.to(kFloat64);
  par.to(kFloat64);
  optim::SGD opt_whole(whole.parameters(), {.lr = 0.2, .momentum = 0.9});
  optim::SGD opt_par(par.parameters(), {.lr = 0.2, .momentum = 0.9});
  Generator data(8);
  const dist::VocabRange mine = par.tok.range;
  const int64_t part = hidden / n;
  std::vector<double> losses;
  const Tensor ids = randint(0, vocab, {3, kSeq}, TensorOptions(kInt64), &data);
  const Tensor target = randint(0, vocab, {3, kSeq}, TensorOptions(kInt64), &data);  // 0 is ignored
  for (int step = 0; step < 4; ++step) {
    const Tensor loss = par.loss(ids, target), loss_ref = whole.loss(ids, target);
    EXPECT_NEAR(loss.item<double>(), loss_ref.item<double>(), 1e-12) << "step " << step;
    losses.push_back(loss_ref.item<double>());
    loss.backward();
    loss_ref.backward();
    // the tied table's gradient has both uses: the lookup and the output projection
    EXPECT_TRUE(allclose(par.tok.weight.grad(), whole.tok.weight.grad().narrow(0, mine.start, mine.size()), 1e-12,
                         1e-13)) << "step " << step;
    EXPECT_TRUE(allclose(par.pos.weight.grad(), whole.pos.weight.grad(), 1e-12, 1e-13)) << "step " << step;
    opt_par.step();
    opt_whole.step();
    opt_par.zero_grad();
    opt_whole.zero_grad();
  }
  EXPECT_LT(losses.back(), losses.front());  // it learns the batch
  EXPECT_TRUE(allclose(par.tok.full_weight(), whole.tok.weight.detach(), 1e-12, 1e-13));
  EXPECT_TRUE(allclose(par.fc1.weight, whole.fc1.weight.detach().narrow(0, rank * part, part), 1e-12, 1e-13));
  EXPECT_TRUE(allclose(par.fc2.weight, whole.fc2.weight.detach().narrow(1, rank * part, part), 1e-12, 1e-13));
  EXPECT_TRUE(allclose(par.fc2.bias, whole.fc2.bias.detach(), 1e-12, 1e-13));
}

}  // namespace
}  // namespace strata
