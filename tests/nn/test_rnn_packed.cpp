// Packed sequences (nn/rnn_utils.hpp): the packed layout against a loop over steps and sorted
// sequences written here and torch.nn.utils.rnn.pack_sequence's documented example; round trips
// through padding; RNN, LSTM (with and without proj_size) and GRU over a packed batch against
// each sequence run alone, unpadded; finite-difference gradients in float64; bad input.
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
namespace R = strata::nn::utils::rnn;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;

namespace {

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : values(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

// The packed rows of x (T, B, F) by their definition: step by step, the sequences longer than the
// step in decreasing order of length (ties in batch order).
std::vector<double> packed_by_loop(const Tensor& x, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<double> out;
  for (int64_t t = 0; t < x.size(0); ++t)
    for (int64_t b : order)
      if (t < lengths[static_cast<size_t>(b)])
        for (double v : values(x[t][b])) out.push_back(v);
  return out;
}

enum class Kind { Rnn, Lstm, LstmProj, Gru };

std::unique_ptr<nn::RNNBase> make_layer(Kind kind, int64_t in, int64_t hidden, nn::RecurrentOptions o) {
  if (kind == Kind::Rnn) return std::make_unique<nn::RNN>(in, hidden, nn::RNNOptions{o.num_layers, "tanh", o.bias,
                                                                                   o.batch_first, o.dropout,
                                                                                   o.bidirectional, o.generator});
  if (kind == Kind::Gru) return std::make_unique<nn::GRU>(in, hidden, o);
  if (kind == Kind::LstmProj) o.proj_size = 2;
  return std::make_unique<nn::LSTM>(in, hidden, o);
}

}  // namespace

TEST(PackedSequence, LayoutMatchesDefinition) {
  Generator g(51);
  const Tensor x = randn({4, 3, 2}, kFloat64, &g);  // (T, B, F)
  const std::vector<int64_t> lengths = {2, 4, 1};
  const R::PackedSequence p = R::pack_padded_sequence(x, lengths, false, false);
  EXPECT_EQ(p.data.shape(), (Shape{7, 2}));
  EXPECT_TRUE(all_close(p.data, packed_by_loop(x, lengths), 0, 0));
  EXPECT_EQ(ints(p.batch_sizes), (std::vector<int64_t>{3, 2, 1, 1}));
  EXPECT_EQ(p.batch_sizes.device(), Device::cpu());
  EXPECT_EQ(ints(p.sorted_indices), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(ints(p.unsorted_indices), (std::vector<int64_t>{1, 0, 2}));

  // batch_first, lengths as a tensor: the same packing
  const R::PackedSequence q = R::pack_padded_sequence(x.transpose(0, 1).contiguous(), from_vector(lengths), true,
                                                      false);
  EXPECT_TRUE(all_close(q.data, values(p.data), 0, 0));
  // ties keep the batch's order; sorted input with enforce_sorted keeps no permutation
  const std::vector<int64_t> sorted = {4, 2, 2};
  const R::PackedSequence s = R::pack_padded_sequence(x, sorted);
  EXPECT_FALSE(s.sorted_indices.defined());
  EXPECT_FALSE(s.unsorted_indices.defined());
  EXPECT_TRUE(all_close(s.data, packed_by_loop(x, sorted), 0, 0));
  EXPECT_EQ(ints(s.batch_sizes), (std::vector<int64_t>{3, 3, 1, 1}));
}

TEST(PackedSequence, PackSequenceDocumentedExample) {
  // torch.nn.utils.rnn.pack_sequence's docstring: [1, 2, 3], [4, 5], [6] pack to
  // data [1, 4, 6, 2, 5, 3], batch_sizes [3, 2, 1]
  const std::vector<Tensor> seqs = {from_vector(std::vector<double>{1, 2, 3}), from_vector(std::vector<double>{4, 5}),
                                    from_vector(std::vector<double>{6})};
  const R::PackedSequence p = R::pack_sequence(seqs);
  EXPECT_TRUE(all_close(p.data, {1, 4, 6, 2, 5, 3}, 0, 0));
  EXPECT_EQ(ints(p.batch_sizes), (std::vector<int64_t>{3, 2, 1}));
  // pad_sequence of the same: columns are the sequences, padded with the value given
  const Tensor padded = R::pad_sequence(seqs, false, -1);
  EXPECT_EQ(padded.shape(), (Shape{3, 3}));
  EXPECT_TRUE(all_close(padded, {1, 4, 6, 2, 5, -1, 3, -1, -1}, 0, 0));
  EXPECT_TRUE(all_close(R::pad_sequence(seqs, true), {1, 2, 3, 4, 5, 0, 6, 0, 0}, 0, 0));
  // unsorted sequences need enforce_sorted = false, and come back in their own order
  const std::vector<Tensor> unsorted = {seqs[1], seqs[0], seqs[2]};
  const R::PackedSequence u = R::pack_sequence(unsorted, false);
  EXPECT_TRUE(all_close(u.data, {1, 4, 6, 2, 5, 3}, 0, 0));
  const std::vector<Tensor> back = R::unpack_sequence(u);
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(all_close(back[i], values(unsorted[i]), 0, 0));
}

TEST(PackedSequence, RoundTripsThroughPadding) {
  Generator g(52);
  const Tensor x = randn({5, 4, 3}, kFloat64, &g);
  const std::vector<int64_t> lengths = {3, 5, 1, 3};
  for (bool batch_first : {false, true}) {
    SCOPED_TRACE(fmt::format("batch_first {}", batch_first));
    const Tensor input = batch_first ? x.transpose(0, 1) : x;  // a strided view when batch_first
    const R::PackedSequence p = R::pack_padded_sequence(input, lengths, batch_first, false);
    const auto [padded, got_lengths] = R::pad_packed_sequence(p, batch_first, 7.5, 6);
    EXPECT_EQ(ints(got_lengths), lengths);
    const Tensor tb = batch_first ? padded.transpose(0, 1) : padded;  // (T, B, F)
    ASSERT_EQ(tb.shape(), (Shape{6, 4, 3}));
    std::vector<double> want;
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t f = 0; f < 3; ++f)
          want.push_back(t < lengths[static_cast<size_t>(b)] ? x[t][b][f].item<double>() : 7.5);
    EXPECT_TRUE(all_close(tb, want, 0, 0));
    const std::vector<Tensor> cut = R::unpad_sequence(padded, ints(got_lengths), batch_first);
    const std::vector<Tensor> unpacked = R::unpack_sequence(p);
    for (size_t b = 0; b < 4; ++b) {
      EXPECT_TRUE(all_close(cut[b], values(x.select(1, static_cast<int64_t>(b)).narrow(0, 0, lengths[b])), 0, 0));
      EXPECT_TRUE(all_close(unpacked[b], values(cut[b]), 0, 0));
    }
    EXPECT_TRUE(all_close(R::pack_sequence(cut, false).data, values(p.data), 0, 0));
  }
}

TEST(PackedSequence, GradientsFlowThroughPackingAndPadding) {
  Generator g(53);
  const std::vector<int64_t> lengths = {2, 3, 1};
  auto f = [&](V in) {
    const R::PackedSequence p = R::pack_padded_sequence(in[0], lengths, true, false);
    const Tensor repacked = R::pack_sequence({in[1], in[2]}, false).data;
    return cat({R::pad_packed_sequence(p, false, 0.5).padded.flatten(), repacked.flatten()}, 0);
  };
  EXPECT_TRUE(gradcheck(f, {leaf(randn({3, 3, 2}, kFloat64, &g)), leaf(randn({2, 2}, kFloat64, &g)),
                            leaf(randn({4, 2}, kFloat64, &g))}));
}

// ---- the layers over a packed batch --------------------------------------------------------------

TEST(PackedRecurrent, EachSequenceAsIfRunAlone) {
  const Kind kinds[] = {Kind::Rnn, Kind::Lstm, Kind::LstmProj, Kind::Gru};
  const char* names[] = {"RNN", "LSTM", "LSTM proj_size 2", "GRU"};
  const std::vector<int64_t> lengths = {3, 5, 1, 4, 5};
  for (size_t k = 0; k < 4; ++k)
    for (int64_t layers : {1, 2})
      for (bool bidirectional : {false, true}) {
        SCOPED_TRACE(fmt::format("{} layers {} bidirectional {}", names[k], layers, bidirectional));
        Generator g(54);
        auto m = make_layer(kinds[k], 3, 4, {.num_layers = layers, .bidirectional = bidirectional, .generator = &g});
        m->to(kFloat64);
        const bool lstm = kinds[k] != Kind::Rnn && kinds[k] != Kind::Gru;
        const int64_t states = layers * (bidirectional ? 2 : 1), h_size = m->state_size;
        // the padding holds values that must not leak into any result
        const Tensor x = randn({5, 5, 3}, kFloat64, &g);
        const Tensor h0 = randn({states, 5, h_size}, kFloat64, &g), c0 = randn({states, 5, 4}, kFloat64, &g);
        const nn::PackedRNNOutput out =
            m->forward_with_state(R::pack_padded_sequence(x, lengths, false, false), h0, lstm ? c0 : Tensor());
        EXPECT_EQ(out.h_n.shape(), (Shape{states, 5, h_size}));
        const Tensor padded = R::pad_packed_sequence(out.output).padded;  // (5, 5, D * H)
        for (int64_t b = 0; b < 5; ++b) {
          const int64_t n = lengths[static_cast<size_t>(b)];
          const nn::RNNOutput alone = m->forward_with_state(x.narrow(0, 0, n).narrow(1, b, 1), h0.narrow(1, b, 1),
                                                            lstm ? c0.narrow(1, b, 1) : Tensor());
          EXPECT_TRUE(all_close(padded.narrow(0, 0, n).select(1, b), values(alone.output), 1e-12, 1e-12));
          EXPECT_TRUE(all_close(out.h_n.select(1, b), values(alone.h_n), 1e-12, 1e-12));
          if (lstm) EXPECT_TRUE(all_close(out.c_n.select(1, b), values(alone.c_n), 1e-12, 1e-12));
        }
        // forward(PackedSequence) keeps the layout; zero initial states by default
        const R::PackedSequence y = m->forward(R::pack_padded_sequence(x, lengths, false, false));
        EXPECT_EQ(ints(y.batch_sizes), (std::vector<int64_t>{5, 4, 4, 3, 2}));
        const nn::RNNOutput first = m->forward_with_state(x.narrow(0, 0, 3).narrow(1, 0, 1));
        EXPECT_TRUE(all_close(R::unpack_sequence(y)[0], values(first.output), 1e-12, 1e-12));
      }
}

TEST(PackedRecurrent, SortedBatchInFloat32) {
  Generator g(55);
  nn::LSTM lstm(2, 3, {.bidirectional = true, .generator = &g});
  const Tensor x = randn({4, 3, 2}, kFloat32, &g);
  const std::vector<int64_t> lengths = {4, 4, 2};
  const nn::PackedRNNOutput out = lstm.forward_with_state(R::pack_padded_sequence(x, lengths));
  EXPECT_FALSE(out.output.sorted_indices.defined());
  EXPECT_EQ(out.output.data.dtype(), kFloat32);
  const nn::RNNOutput last = lstm.forward_with_state(x.narrow(0, 0, 2).narrow(1, 2, 1));
  EXPECT_TRUE(all_close(out.h_n.select(1, 2), values(last.h_n), 1e-5, 1e-6));
  EXPECT_TRUE(all_close(out.c_n.select(1, 2), values(last.c_n), 1e-5, 1e-6));
}

TEST(PackedRecurrent, FiniteDifferenceGradients) {
  // through the padded input, the initial states and every parameter
  const std::vector<int64_t> lengths = {2, 3, 1};
  for (Kind kind : {Kind::LstmProj, Kind::Gru}) {
    Generator g(56);
    auto m = make_layer(kind, 2, 3, {.num_layers = 2, .bidirectional = true, .generator = &g});
    m->to(kFloat64);
    const bool lstm = kind == Kind::LstmProj;
    std::vector<Tensor> inputs = {leaf(randn({3, 3, 2}, kFloat64, &g)),
                                  leaf(randn({4, 3, m->state_size}, kFloat64, &g))};
    if (lstm) inputs.push_back(leaf(randn({4, 3, 3}, kFloat64, &g)));
    for (const Tensor& p : m->parameters()) inputs.push_back(p);
    auto f = [&](V in) {
      const nn::PackedRNNOutput r = m->forward_with_state(R::pack_padded_sequence(in[0], lengths, false, false),
                                                          in[1], lstm ? in[2] : Tensor());
      std::vector<Tensor> parts = {r.output.data.flatten(), r.h_n.flatten()};
      if (lstm) parts.push_back(r.c_n.flatten());
      return cat(parts, 0);
    };
    EXPECT_TRUE(gradcheck(f, inputs));
  }
}

TEST(PackedRecurrent, DropoutBetweenLayersAsForAPaddedBatch) {
  // equal lengths pack to the padded batch's rows in the same order, so the layer's generator,
  // seeded alike, draws the same masks: the packed output is the padded one, in training too
  Generator g(58);
  nn::LSTM lstm(3, 4, {.num_layers = 2, .dropout = 0.5, .generator = &g, .proj_size = 2});
  const Tensor x = randn({4, 3, 3}, kFloat32, &g);
  const R::PackedSequence p = R::pack_padded_sequence(x, {4, 4, 4});
  g.manual_seed(7);
  const nn::RNNOutput padded = lstm.forward_with_state(x);
  g.manual_seed(7);
  const nn::PackedRNNOutput packed = lstm.forward_with_state(p);
  EXPECT_TRUE(all_close(packed.output.data, values(padded.output), 0, 0));
  EXPECT_TRUE(all_close(packed.h_n, values(padded.h_n), 0, 0));
  lstm.eval();
  EXPECT_FALSE(all_close(lstm.forward(p).data, values(packed.output.data), 1e-4, 1e-4));  // the masks mattered
}

TEST(PackedRecurrent, UnsortedIndicesDefaultToTheInverseAndMustBeIt) {
  // as torch's PackedSequence(data, batch_sizes, sorted_indices): unsorted_indices, left out, is
  // the inverse of sorted_indices; given, it must be that inverse (the states come back through it)
  Generator g(57);
  nn::GRU gru(2, 3, {.generator = &g});
  const Tensor x = randn({4, 3, 2}, kFloat32, &g);
  const R::PackedSequence full = R::pack_padded_sequence(x, {2, 4, 1}, false, false);
  const nn::PackedRNNOutput want = gru.forward_with_state(full);
  R::PackedSequence only_sorted = full;
  only_sorted.unsorted_indices = Tensor();
  const nn::PackedRNNOutput got = gru.forward_with_state(only_sorted);
  EXPECT_TRUE(all_close(got.h_n, values(want.h_n), 0, 0));
  EXPECT_EQ(ints(got.output.unsorted_indices), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_TRUE(all_close(R::pad_packed_sequence(only_sorted).padded, values(R::pad_packed_sequence(full).padded), 0,
                        0));
  R::PackedSequence wrong = full;
  wrong.unsorted_indices = from_vector(std::vector<int64_t>{0, 1, 2});
  EXPECT_TRUE(throws_with([&] { gru.forward_with_state(wrong); },
                          {"[GRU(2, 3)]", "unsorted_indices", "inverse of sorted_indices"}));
  R::PackedSequence only_unsorted = full;
  only_unsorted.sorted_indices = Tensor();
  EXPECT_TRUE(throws_with([&] { R::unpack_sequence(only_unsorted); }, {"[unpack_sequence]", "without sorted_indices"}));
}

// ---- bad input -----------------------------------------------------------------------------------

TEST(PackedSequence, BadInputRaises) {
  const Tensor x = randn({4, 3, 2});
  const char* pack = "[pack_padded_sequence]";
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(x, {2, 0, 1}, false, false); }, {pack, "[1, 4]", "0"}));
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(x, {2, 5, 1}, false, false); }, {pack, "[1, 4]"}));
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(x, {2, 1}); }, {pack, "2 lengths for a batch of 3"}));
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(x, {2, 3, 1}); }, {pack, "enforce_sorted = false"}));
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(x, randn({3})); }, {pack, "1-d integer tensor"}));
  EXPECT_TRUE(throws_with([&] { R::pack_padded_sequence(randn({4}), {4}); }, {pack, "(T, B, *)"}));
  EXPECT_TRUE(throws_with([&] { R::pack_sequence({randn({3, 2}), randn({2, 3})}); },
                          {"[pack_sequence]", "sequence 1", "does not match"}));
  EXPECT_TRUE(throws_with([&] { R::pad_sequence({}); }, {"[pad_sequence]", "at least one"}));
  const R::PackedSequence p = R::pack_padded_sequence(x, {4, 2, 1});
  EXPECT_TRUE(throws_with([&] { R::pad_packed_sequence(p, false, 0, 3); },
                          {"[pad_packed_sequence]", "total_length 3", "(4 steps)"}));
  R::PackedSequence rising = p;
  rising.batch_sizes = from_vector(std::vector<int64_t>{1, 2, 3, 1});
  EXPECT_TRUE(throws_with([&] { R::pad_packed_sequence(rising); }, {"non-increasing"}));
  R::PackedSequence short_data = p;
  short_data.data = p.data.narrow(0, 0, 5);
  EXPECT_TRUE(throws_with([&] { R::unpack_sequence(short_data); }, {"[unpack_sequence]", "sum to 7", "5 rows"}));

  nn::LSTM lstm(2, 4, {.proj_size = 3});
  const char* layer = "[LSTM(2, 4, proj_size=3)]";
  EXPECT_TRUE(throws_with([&] { lstm.forward(R::pack_padded_sequence(randn({4, 3, 5}), {4, 2, 1})); },
                          {layer, "(sum of lengths, 2)", "[7, 5]"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(p, randn({1, 2, 3}), randn({1, 3, 4})); },
                          {layer, "h0 of shape [1, 3, 3]", "proj_size"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(p, randn({1, 3, 3})); }, {layer, "together"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward(short_data); }, {layer, "sum to 7"}));
}
