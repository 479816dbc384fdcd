// Traced dependency groups through RNN, LSTM and GRU (Note [Recurrent units]): the input
// features go with the producer, hidden unit i with its gate rows in every layer and direction
// and with the consumer's columns i and hidden + i. A hidden unit whose gate rows are all zero
// stays 0 from a zero initial state (LSTM: c = f c + i tanh(0) = 0; GRU: n = tanh(0) = 0 and
// h = z h; RNN: tanh(0)), so the pruned model computes what its twin computes with those rows
// zeroed (float64, 1e-12). proj_size's projected features are reported unprunable; a failed prune
// leaves the layer as it was.
#include "depgraph_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::complement;
using strata::testing::expect_same;
using strata::testing::expect_trains;
using strata::testing::expect_unprunable;
using strata::testing::group_of;
using strata::testing::throws_with;
using strata::testing::twins;
using strata::testing::values;
using strata::testing::zero_rows;
using strata::testing::zero_slices;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

constexpr int64_t kHidden = 6;

double l1(const Tensor& t) { return abs(t).sum().item<double>(); }

// x (N, T, 4) -> in -> relu -> recurrent layer (2 layers, bidirectional, batch_first) -> mean over T -> fc
template <class Layer> struct RecurrentNet : nn::Module {
  nn::Linear in;
  Layer rnn;
  nn::Linear fc;
  explicit RecurrentNet(Generator& g, int64_t proj_size = 0)
      : in(4, 5, {.generator = &g}),
        rnn(5, kHidden, {.num_layers = 2, .batch_first = true, .bidirectional = true, .generator = &g,
                         .proj_size = proj_size}),
        fc(2 * (proj_size > 0 ? proj_size : kHidden), 3, {.generator = &g}) {
    register_module("in", in), register_module("rnn", rnn), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override { return fc(rnn(F::relu(in(x))).mean(1)); }
};

// nn::RNN takes RNNOptions (with the nonlinearity), the others RecurrentOptions
struct TanhRNN : nn::RNN {
  TanhRNN(int64_t in, int64_t hidden, nn::RecurrentOptions o)
      : nn::RNN(in, hidden, {.num_layers = o.num_layers, .batch_first = o.batch_first,
                             .bidirectional = o.bidirectional, .generator = o.generator}) {}
};

// Zeroes hidden units' gate rows in every layer and direction.
void zero_hidden(nn::RNNBase& r, const std::vector<int64_t>& units) {
  const int64_t gates = r.all_weights[0].weight_ih.size(0) / r.hidden_size;
  std::vector<int64_t> rows;
  for (int64_t gate = 0; gate < gates; ++gate)
    for (int64_t i : units) rows.push_back(gate * r.hidden_size + i);
  for (const nn::RecurrentWeights& w : r.all_weights) zero_rows({w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh}, rows);
}

template <class Layer> void expect_hidden_units_pruned() {
  Generator g(61);
  const Tensor x = randn({2, 3, 4}, kFloat64, &g);
  auto [pruned, zeroed] = twins<RecurrentNet<Layer>>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t hidden = group_of(graph, &pruned->rnn, R::Out);
  EXPECT_TRUE(graph.groups()[hidden].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[hidden].size, kHidden);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), hidden);
  const size_t features = group_of(graph, &pruned->in, R::Out);
  EXPECT_TRUE(graph.groups()[features].prunable()) << graph.report();
  EXPECT_EQ(group_of(graph, &pruned->rnn, R::In), features);
  // the hidden units' L1 importance: their gate rows, weight_hh columns and the second layer's
  // weight_ih columns (one per direction) in every layer and direction, and fc's two columns
  std::vector<double> want(kHidden, 0.0);
  const int64_t gates = pruned->rnn.all_weights[0].weight_ih.size(0) / kHidden;
  for (size_t k = 0; k < pruned->rnn.all_weights.size(); ++k) {
    const nn::RecurrentWeights& w = pruned->rnn.all_weights[k];
    for (int64_t i = 0; i < kHidden; ++i) {
      for (int64_t gate = 0; gate < gates; ++gate)
        for (const Tensor& t : {w.weight_ih, w.weight_hh}) want[i] += l1(t.select(0, gate * kHidden + i));
      want[i] += l1(w.weight_hh.select(1, i));
      if (k >= 2)
        for (int64_t d = 0; d < 2; ++d) want[i] += l1(w.weight_ih.select(1, d * kHidden + i));
    }
  }
  for (int64_t i = 0; i < kHidden; ++i)
    for (int64_t d = 0; d < 2; ++d) want[i] += l1(pruned->fc.weight.select(1, d * kHidden + i));
  const std::vector<double> got = graph.importance(hidden);
  for (int64_t i = 0; i < kHidden; ++i) EXPECT_NEAR(got[i], want[i], 1e-9) << i;

  const std::vector<int64_t> kept = {0, 1, 3, 5};
  graph.prune_group(hidden, kept);
  graph.prune_group(group_of(graph, &pruned->in, R::Out), {0, 2, 4});
  zero_hidden(zeroed->rnn, complement(kHidden, kept));
  zero_rows({zeroed->in.weight, zeroed->in.bias}, {1, 3});  // relu(0): the inputs read zeros
  EXPECT_EQ(pruned->rnn.hidden_size, 4);
  EXPECT_EQ(pruned->rnn.input_size, 3);
  EXPECT_EQ(pruned->rnn.all_weights[0].weight_ih.shape(), (Shape{gates * 4, 3}));
  EXPECT_EQ(pruned->rnn.all_weights[3].weight_ih.shape(), (Shape{gates * 4, 8}));
  EXPECT_EQ(pruned->rnn.all_weights[3].weight_hh.shape(), (Shape{gates * 4, 4}));
  EXPECT_EQ(pruned->fc.in_features, 8);
  EXPECT_NE(pruned->rnn.description().find("(3, 4, num_layers=2"), std::string::npos) << pruned->rnn.description();
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

TEST(DependencyGraphRecurrent, LSTMHiddenUnitsAndInputsMatchTheZeroedNetwork) {
  expect_hidden_units_pruned<nn::LSTM>();
}
TEST(DependencyGraphRecurrent, GRUHiddenUnitsAndInputsMatchTheZeroedNetwork) {
  expect_hidden_units_pruned<nn::GRU>();
}
TEST(DependencyGraphRecurrent, RNNHiddenUnitsAndInputsMatchTheZeroedNetwork) { expect_hidden_units_pruned<TanhRNN>(); }

// With proj_size the hidden units go (their gate rows and weight_hr's columns); the projected
// features the consumer reads are kept, with the reason.
TEST(DependencyGraphRecurrent, ProjectedLSTMKeepsItsOutputFeaturesWithTheReason) {
  Generator g(67);
  const Tensor x = randn({2, 3, 4}, kFloat64, &g);
  Generator ga(5), gb(5);
  RecurrentNet<nn::LSTM> pruned(ga, 2), zeroed(gb, 2);
  pruned.to(kFloat64), zeroed.to(kFloat64);
  compress::DependencyGraph graph(pruned, x);
  expect_unprunable(graph, &pruned.fc, R::In, "projected features");
  const size_t hidden = group_of(graph, &pruned.rnn, R::Out);
  EXPECT_TRUE(graph.groups()[hidden].prunable()) << graph.report();
  graph.prune_group(hidden, {1, 2, 4});
  zero_hidden(zeroed.rnn, {0, 3, 5});
  EXPECT_EQ(pruned.rnn.all_weights[2].weight_hr.shape(), (Shape{2, 3}));
  EXPECT_EQ(pruned.rnn.all_weights[2].weight_hh.shape(), (Shape{4 * 3, 2}));
  expect_same(pruned, zeroed, x);
}

// States given to the call (lstm(x, h0, c0)) return h_n and c_n too: the call is not followed
// whole, and its channels are kept with a reason.
TEST(DependencyGraphRecurrent, ACallWithStatesIsReportedUnprunable) {
  struct Net : nn::Module {
    nn::Linear in;
    nn::LSTM rnn;
    explicit Net(Generator& g) : in(4, 5, {.generator = &g}), rnn(5, 3, {.generator = &g}) {
      register_module("in", in), register_module("rnn", rnn);
    }
    Tensor forward(const Tensor& x) override {
      const Tensor h0 = zeros({1, x.size(1), 3});
      return rnn(in(x), h0, h0).output.mean(0);
    }
  };
  Generator g(71);
  Net net(g);
  compress::DependencyGraph graph(net, randn({3, 2, 4}, kFloat32, &g));
  expect_unprunable(graph, &net.in, R::Out, "LSTM");
}

// The output split in two by a size fixed in the forward (the directions): once the hidden units
// go the forward fails, and the prune is undone, every weight and size as it was.
struct FixedSplitNet : RecurrentNet<nn::GRU> {
  explicit FixedSplitNet(Generator& g) : RecurrentNet<nn::GRU>(g) {}
  Tensor forward(const Tensor& x) override {
    const std::vector<Tensor> p = split_with_sizes(rnn(F::relu(in(x))), {kHidden, kHidden}, -1);
    return fc(cat({p[1], p[0]}, -1).mean(1));
  }
};

TEST(DependencyGraphRecurrent, AFailedPruneLeavesTheLayerAsItWas) {
  Generator g(103);
  const Tensor x = randn({2, 3, 4}, kFloat64, &g);
  auto [net, reference] = twins<FixedSplitNet>(x);
  compress::DependencyGraph graph(*net, x);
  const size_t hidden = group_of(graph, &net->rnn, R::Out);
  EXPECT_TRUE(graph.groups()[hidden].prunable()) << graph.report();
  EXPECT_TRUE(throws_with([&] { graph.prune_group(hidden, {0, 2, 3, 5}); }, {"nothing was pruned"}));
  EXPECT_EQ(net->rnn.hidden_size, kHidden);
  EXPECT_EQ(net->rnn.state_size, kHidden);
  EXPECT_EQ(net->rnn.input_size, 5);
  for (size_t k = 0; k < net->rnn.all_weights.size(); ++k) {
    const nn::RecurrentWeights &w = net->rnn.all_weights[k], &r = reference->rnn.all_weights[k];
    for (auto [a, b] : {std::pair{w.weight_ih, r.weight_ih}, std::pair{w.weight_hh, r.weight_hh},
                        std::pair{w.bias_ih, r.bias_ih}, std::pair{w.bias_hh, r.bias_hh}})
      EXPECT_TRUE(all_close(a, values(b), 0, 0)) << k;
  }
  EXPECT_EQ(net->fc.in_features, 2 * kHidden);
  expect_same(*net, *reference, x);
}

}  // namespace
