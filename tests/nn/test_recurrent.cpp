// RNN, LSTM and GRU against a plain-loop float64 reference of the update equations in PyTorch's
// documentation, written here (several layers, bidirectional, batch_first, without bias, given
// initial states; float64 and float32); finite-difference gradients through the input, the
// states and every parameter; PyTorch's parameter names, shapes, order and init bounds; unbatched
// input; dropout between layers; the cells against the reference step; bad configurations and
// inputs.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::Mat;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;

namespace {

enum class Kind { RnnTanh, RnnRelu, Lstm, Gru };
const Kind kKinds[] = {Kind::RnnTanh, Kind::RnnRelu, Kind::Lstm, Kind::Gru};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::RnnTanh: return "RNN tanh";
    case Kind::RnnRelu: return "RNN relu";
    case Kind::Lstm: return "LSTM";
    case Kind::Gru: return "GRU";
  }
  return "?";
}

std::unique_ptr<nn::RNNBase> make_layer(Kind kind, int64_t in, int64_t hidden, const nn::RecurrentOptions& o) {
  if (kind == Kind::Lstm) return std::make_unique<nn::LSTM>(in, hidden, o);
  if (kind == Kind::Gru) return std::make_unique<nn::GRU>(in, hidden, o);
  const nn::RNNOptions rnn{o.num_layers, kind == Kind::RnnRelu ? "relu" : "tanh", o.bias, o.batch_first, o.dropout,
                           o.bidirectional, o.generator};
  return std::make_unique<nn::RNN>(in, hidden, rnn);
}

std::unique_ptr<nn::RNNCellBase> make_cell(Kind kind, int64_t in, int64_t hidden, bool bias, Generator* gen) {
  if (kind == Kind::Lstm) return std::make_unique<nn::LSTMCell>(in, hidden, nn::LSTMCellOptions{bias, gen});
  if (kind == Kind::Gru) return std::make_unique<nn::GRUCell>(in, hidden, nn::GRUCellOptions{bias, gen});
  const nn::RNNCellOptions rnn{bias, kind == Kind::RnnRelu ? "relu" : "tanh", gen};
  return std::make_unique<nn::RNNCell>(in, hidden, rnn);
}

// The next (h, c) of a cell of any kind (c undefined but for LSTM).
nn::LSTMState run_cell(nn::RNNCellBase& cell, Kind kind, const Tensor& x, const Tensor& h, const Tensor& c) {
  if (kind == Kind::Lstm) return dynamic_cast<nn::LSTMCell&>(cell).forward_with_state(x, h, c);
  if (kind == Kind::Gru) return {dynamic_cast<nn::GRUCell&>(cell).forward(x, h), Tensor()};
  return {dynamic_cast<nn::RNNCell&>(cell).forward(x, h), Tensor()};
}

// ---- the reference -----------------------------------------------------------------------------

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

// One layer's parameters in one direction, read by PyTorch's names; absent biases are zero.
struct RefWeights {
  Mat w_ih, w_hh;
  std::vector<double> b_ih, b_hh;
};

RefWeights ref_weights(const nn::StateDict& sd, const std::string& suffix) {
  RefWeights w{Mat(sd.at("weight_ih" + suffix)), Mat(sd.at("weight_hh" + suffix)), {}, {}};
  const std::vector<double> none(static_cast<size_t>(w.w_ih.rows), 0.0);
  w.b_ih = sd.count("bias_ih" + suffix) ? values(sd.at("bias_ih" + suffix)) : none;
  w.b_hh = sd.count("bias_hh" + suffix) ? values(sd.at("bias_hh" + suffix)) : none;
  return w;
}

// One time step of one sample: x (in), h and c (H) updated in place. PyTorch's equations:
//   RNN   h' = tanh(W_ih x + b_ih + W_hh h + b_hh)  (or relu)
//   LSTM  i, f, o = sigmoid(W_i* x + b_i* + W_h* h + b_h*), g = tanh(...), c' = f c + i g, h' = o tanh(c')
//   GRU   r, z = sigmoid(...), n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h
void reference_step(Kind kind, const RefWeights& w, const double* x, std::vector<double>& h, std::vector<double>& c) {
  const int64_t gates = w.w_ih.rows, hidden = w.w_hh.cols;
  std::vector<double> px(static_cast<size_t>(gates)), ph(static_cast<size_t>(gates));
  for (int64_t j = 0; j < gates; ++j) {
    px[j] = w.b_ih[j];
    ph[j] = w.b_hh[j];
    for (int64_t k = 0; k < w.w_ih.cols; ++k) px[j] += w.w_ih(j, k) * x[k];
    for (int64_t k = 0; k < hidden; ++k) ph[j] += w.w_hh(j, k) * h[k];
  }
  auto pre = [&](int64_t gate, int64_t j) { return px[gate * hidden + j] + ph[gate * hidden + j]; };
  std::vector<double> next(static_cast<size_t>(hidden));
  for (int64_t j = 0; j < hidden; ++j) {
    if (kind == Kind::RnnTanh) {
      next[j] = std::tanh(pre(0, j));
    } else if (kind == Kind::RnnRelu) {
      next[j] = std::max(0.0, pre(0, j));
    } else if (kind == Kind::Lstm) {
      const double i = sigmoid(pre(0, j)), f = sigmoid(pre(1, j)), g = std::tanh(pre(2, j)), o = sigmoid(pre(3, j));
      c[j] = f * c[j] + i * g;
      next[j] = o * std::tanh(c[j]);
    } else {
      const double r = sigmoid(pre(0, j)), z = sigmoid(pre(1, j));
      const double n = std::tanh(px[2 * hidden + j] + r * ph[2 * hidden + j]);
      next[j] = (1 - z) * n + z * h[j];
    }
  }
  h = next;
}

struct Sizes {
  int64_t layers, directions, in, hidden, steps, batch;
  int64_t states() const { return layers * directions; }
};

// C-order arrays: output (L, N, directions * H); h_n and c_n (S, N, H).
struct RefOutput {
  std::vector<double> output, h_n, c_n;
};

// x (L, N, in), h0 and c0 (S, N, H).
RefOutput reference(Kind kind, const nn::StateDict& sd, const Sizes& s, const std::vector<double>& x,
                    const std::vector<double>& h0, const std::vector<double>& c0) {
  const int64_t L = s.steps, N = s.batch, H = s.hidden, D = s.directions;
  RefOutput r{{}, std::vector<double>(h0.size()), std::vector<double>(c0.size())};
  std::vector<double> in = x;
  int64_t features = s.in;
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    std::vector<double> out(static_cast<size_t>(L * N * D * H));
    for (int64_t d = 0; d < D; ++d) {
      const RefWeights w = ref_weights(sd, "_l" + std::to_string(layer) + (d == 1 ? "_reverse" : ""));
      const int64_t k = layer * D + d;
      for (int64_t n = 0; n < N; ++n) {
        const auto first = static_cast<size_t>((k * N + n) * H);
        std::vector<double> h(h0.begin() + first, h0.begin() + first + H);
        std::vector<double> c(c0.begin() + first, c0.begin() + first + H);
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = d == 0 ? i : L - 1 - i;
          reference_step(kind, w, &in[static_cast<size_t>((t * N + n) * features)], h, c);
          std::copy(h.begin(), h.end(), out.begin() + ((t * N + n) * D + d) * H);
        }
        std::copy(h.begin(), h.end(), r.h_n.begin() + first);
        std::copy(c.begin(), c.end(), r.c_n.begin() + first);
      }
    }
    in = out;
    features = D * H;
  }
  r.output = in;
  return r;
}

}  // namespace

// ---- layers ------------------------------------------------------------------------------------

TEST(Recurrent, MatchesReference) {
  struct Case {
    nn::RecurrentOptions options;
    bool initial_state;
  };
  const Case cases[] = {
      {{}, false},
      {{.num_layers = 2, .bidirectional = true}, true},
      {{.num_layers = 3, .bias = false, .batch_first = true, .bidirectional = true}, true},
      {{.num_layers = 2, .batch_first = true}, false},
      {{.bias = false}, true},
  };
  for (Kind kind : kKinds)
    for (const Case& c : cases) {
      const nn::RecurrentOptions& o = c.options;
      SCOPED_TRACE(fmt::format("{} layers {} bias {} batch_first {} bidirectional {} initial state {}",
                               kind_name(kind), o.num_layers, o.bias, o.batch_first, o.bidirectional,
                               c.initial_state));
      Generator g(41);
      nn::RecurrentOptions with_gen = o;
      with_gen.generator = &g;
      std::unique_ptr<nn::RNNBase> m = make_layer(kind, 3, 4, with_gen);
      const Sizes s{o.num_layers, o.bidirectional ? 2 : 1, 3, 4, 5, 2};
      // float32 values, so that both dtypes see the same numbers
      const Tensor x = randn({s.steps, s.batch, s.in}, kFloat32, &g).to(kFloat64);
      const Tensor h0 = randn({s.states(), s.batch, s.hidden}, kFloat32, &g).to(kFloat64);
      const Tensor c0 = randn({s.states(), s.batch, s.hidden}, kFloat32, &g).to(kFloat64);
      const bool lstm = kind == Kind::Lstm;
      m->to(kFloat64);
      const std::vector<double> zero(static_cast<size_t>(h0.numel()), 0.0);
      const RefOutput want = reference(kind, m->state_dict(), s, values(x), c.initial_state ? values(h0) : zero,
                                       c.initial_state && lstm ? values(c0) : zero);
      for (DType dt : {kFloat64, kFloat32}) {
        SCOPED_TRACE(dtype_name(dt));
        m->to(dt);
        const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
        const Tensor input = o.batch_first ? x.to(dt).transpose(0, 1) : x.to(dt);  // a strided view when batch_first
        const nn::RNNOutput out = c.initial_state
                                      ? m->forward_with_state(input, h0.to(dt), lstm ? c0.to(dt) : Tensor())
                                      : m->forward_with_state(input);
        const Tensor y = o.batch_first ? out.output.transpose(0, 1) : out.output;
        EXPECT_EQ(y.shape(), (Shape{s.steps, s.batch, s.directions * s.hidden}));
        EXPECT_EQ(out.h_n.shape(), (Shape{s.states(), s.batch, s.hidden}));
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(all_close(y, want.output, tol, tol));
        EXPECT_TRUE(all_close(out.h_n, want.h_n, tol, tol));
        EXPECT_EQ(out.c_n.defined(), lstm);
        if (lstm) EXPECT_TRUE(all_close(out.c_n, want.c_n, tol, tol));
        if (!c.initial_state) EXPECT_TRUE(all_close((*m)(input), values(out.output), 0, 0));
      }
    }
}

TEST(Recurrent, FiniteDifferenceGradients) {
  // through the input, the initial states and every parameter; then batch_first without bias
  // or initial states
  for (Kind kind : kKinds) {
    SCOPED_TRACE(kind_name(kind));
    const bool lstm = kind == Kind::Lstm;
    Generator g(42);
    std::unique_ptr<nn::RNNBase> m = make_layer(kind, 2, 3, {.num_layers = 2, .bidirectional = true, .generator = &g});
    m->to(kFloat64);
    std::vector<Tensor> inputs = {leaf(randn({3, 2, 2}, kFloat64, &g)), leaf(randn({4, 2, 3}, kFloat64, &g))};
    if (lstm) inputs.push_back(leaf(randn({4, 2, 3}, kFloat64, &g)));
    for (const Tensor& p : m->parameters()) inputs.push_back(p);
    auto f = [&](V in) {
      const nn::RNNOutput r = m->forward_with_state(in[0], in[1], lstm ? in[2] : Tensor());
      std::vector<Tensor> parts = {r.output.flatten(), r.h_n.flatten()};
      if (lstm) parts.push_back(r.c_n.flatten());
      return cat(parts, 0);
    };
    EXPECT_TRUE(gradcheck(f, inputs));

    std::unique_ptr<nn::RNNBase> plain = make_layer(kind, 2, 3, {.bias = false, .batch_first = true, .generator = &g});
    plain->to(kFloat64);
    std::vector<Tensor> plain_inputs = {leaf(randn({2, 4, 2}, kFloat64, &g))};
    for (const Tensor& p : plain->parameters()) plain_inputs.push_back(p);
    auto f_plain = [&](V in) {
      const nn::RNNOutput r = plain->forward_with_state(in[0]);
      return cat({r.output.flatten(), r.h_n.flatten()}, 0);
    };
    EXPECT_TRUE(gradcheck(f_plain, plain_inputs));
  }
}

TEST(Recurrent, ParameterNamesShapesAndOrder) {
  nn::LSTM lstm(3, 5, {.num_layers = 2, .bidirectional = true});
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& [name, p] : lstm.named_parameters()) {
    names.push_back(name);
    shapes.push_back(p.shape());
  }
  const std::vector<std::string> want_names = {
      "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
      "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse",
      "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1",
      "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"};
  const std::vector<Shape> want_shapes = {{20, 3}, {20, 5}, {20}, {20}, {20, 3}, {20, 5}, {20}, {20},
                                          {20, 10}, {20, 5}, {20}, {20}, {20, 10}, {20, 5}, {20}, {20}};
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(shapes, want_shapes);
  EXPECT_EQ(lstm.state_dict().size(), 16u);
  ASSERT_EQ(lstm.all_weights.size(), 4u);
  EXPECT_TRUE(lstm.all_weights[1].weight_ih.is_same(lstm.named_parameters()[4].second));
  EXPECT_TRUE(lstm.all_weights[2].bias_hh.is_same(lstm.named_parameters()[11].second));

  nn::GRU gru(4, 6, {.bias = false});
  const auto gru_params = gru.named_parameters();
  ASSERT_EQ(gru_params.size(), 2u);
  EXPECT_EQ(gru_params[0].first, "weight_ih_l0");
  EXPECT_EQ(gru_params[0].second.shape(), (Shape{18, 4}));
  EXPECT_EQ(gru_params[1].first, "weight_hh_l0");
  EXPECT_EQ(gru_params[1].second.shape(), (Shape{18, 6}));
  EXPECT_FALSE(gru.all_weights[0].bias_ih.defined());

  nn::RNN rnn(2, 3, {.nonlinearity = "relu"});
  EXPECT_EQ(rnn.state_dict().at("weight_ih_l0").shape(), (Shape{3, 2}));
  EXPECT_EQ(rnn.state_dict().at("bias_hh_l0").shape(), (Shape{3}));

  nn::LSTMCell cell(3, 5);
  std::vector<std::string> cell_names;
  for (const auto& [name, p] : cell.named_parameters()) cell_names.push_back(name);
  EXPECT_EQ(cell_names, (std::vector<std::string>{"weight_ih", "weight_hh", "bias_ih", "bias_hh"}));
  EXPECT_EQ(cell.weight_ih.shape(), (Shape{20, 3}));
  EXPECT_EQ(cell.weight_hh.shape(), (Shape{20, 5}));
  EXPECT_EQ(nn::GRUCell(3, 5, {.bias = false}).state_dict().size(), 2u);
  EXPECT_EQ(nn::RNNCell(3, 5).bias_ih.shape(), (Shape{5}));
}

TEST(Recurrent, InitBoundsAndStateDictRoundTrip) {
  // every parameter U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as torch.nn.RNNBase
  Generator g(43);
  nn::GRU gru(8, 16, {.num_layers = 2, .generator = &g});
  nn::LSTMCell cell(8, 16, {.generator = &g});
  const double bound = 0.25;
  for (const std::vector<Tensor>& params : {gru.parameters(), cell.parameters()})
    for (const Tensor& p : params) {
      double mx = 0;
      for (double v : values(p)) mx = std::max(mx, std::fabs(v));
      EXPECT_LE(mx, bound);
      EXPECT_GT(mx, 0.9 * bound);
    }
  // the same seed draws the same parameters; a state_dict loaded gives the same results
  Generator a(7), b(7);
  nn::GRU same_a(8, 16, {.generator = &a}), same_b(8, 16, {.generator = &b});
  EXPECT_TRUE(all_close(same_a.all_weights[0].weight_hh, values(same_b.all_weights[0].weight_hh), 0, 0));
  nn::GRU loaded(8, 16, {.num_layers = 2});
  loaded.load_state_dict(gru.state_dict());
  const Tensor x = randn({4, 3, 8}, kFloat32, &g);
  EXPECT_TRUE(all_close(loaded(x), values(gru(x)), 0, 0));
}

TEST(Recurrent, UnbatchedEqualsBatchOfOne) {
  Generator g(44);
  for (Kind kind : kKinds)
    for (bool batch_first : {false, true}) {
      SCOPED_TRACE(fmt::format("{} batch_first {}", kind_name(kind), batch_first));
      const bool lstm = kind == Kind::Lstm;
      const nn::RecurrentOptions o{
          .num_layers = 2, .batch_first = batch_first, .bidirectional = true, .generator = &g};
      std::unique_ptr<nn::RNNBase> m = make_layer(kind, 3, 4, o);
      m->to(kFloat64);
      const Tensor x = randn({5, 3}, kFloat64, &g), h0 = randn({4, 4}, kFloat64, &g), c0 = randn({4, 4}, kFloat64, &g);
      const nn::RNNOutput one = m->forward_with_state(x, h0, lstm ? c0 : Tensor());
      const nn::RNNOutput batch =
          m->forward_with_state(x.unsqueeze(batch_first ? 0 : 1), h0.unsqueeze(1), lstm ? c0.unsqueeze(1) : Tensor());
      EXPECT_EQ(one.output.shape(), (Shape{5, 8}));
      EXPECT_EQ(one.h_n.shape(), (Shape{4, 4}));
      EXPECT_TRUE(all_close(one.output, values(batch.output), 1e-14, 1e-14));
      EXPECT_TRUE(all_close(one.h_n, values(batch.h_n), 1e-14, 1e-14));
      if (lstm) EXPECT_TRUE(all_close(one.c_n, values(batch.c_n), 1e-14, 1e-14));
      // without states: zeros
      const Tensor zero_states = m->forward_with_state(x.unsqueeze(batch_first ? 0 : 1)).output;
      EXPECT_TRUE(all_close((*m)(x), values(zero_states), 1e-14, 1e-14));
    }
}

TEST(Recurrent, DropoutBetweenLayersOnlyInTraining) {
  // the layer's generator draws the initial values and then the dropout masks
  Generator g(45);
  nn::LSTM lstm(3, 4, {.num_layers = 3, .dropout = 0.5, .generator = &g});
  nn::LSTM plain(3, 4, {.num_layers = 3});
  plain.load_state_dict(lstm.state_dict());
  const Tensor x = randn({5, 2, 3}, kFloat32, &g);
  const std::vector<double> want = values(plain(x));
  lstm.eval();
  EXPECT_TRUE(all_close(lstm(x), want, 0, 0));
  lstm.train();
  g.manual_seed(9);
  const Tensor a = lstm(x);
  g.manual_seed(9);
  const Tensor b = lstm(x);
  g.manual_seed(10);
  const Tensor c = lstm(x);
  EXPECT_TRUE(all_close(a, values(b), 0, 0));
  EXPECT_FALSE(all_close(a, want, 1e-4, 1e-4));
  EXPECT_FALSE(all_close(a, values(c), 1e-4, 1e-4));
  // one layer has no layer after it to drop into
  nn::GRU single(3, 4, {.dropout = 0.5, .generator = &g});
  const Tensor trained = single(x);
  single.eval();
  EXPECT_TRUE(all_close(trained, values(single(x)), 0, 0));
}

// ---- cells -------------------------------------------------------------------------------------

TEST(RecurrentCells, MatchReferenceStep) {
  for (Kind kind : kKinds)
    for (bool bias : {true, false}) {
      SCOPED_TRACE(fmt::format("{} bias {}", kind_name(kind), bias));
      Generator g(46);
      std::unique_ptr<nn::RNNCellBase> cell = make_cell(kind, 3, 4, bias, &g);
      const bool lstm = kind == Kind::Lstm;
      const Tensor x = randn({2, 3}, kFloat32, &g).to(kFloat64);
      const Tensor h = randn({2, 4}, kFloat32, &g).to(kFloat64), c = randn({2, 4}, kFloat32, &g).to(kFloat64);
      cell->to(kFloat64);
      const RefWeights w = ref_weights(cell->state_dict(), "");
      const std::vector<double> xv = values(x), hv = values(h), cv = values(c);
      std::vector<double> want_h, want_c, zero_h;  // (2, 4); zero_h from zero states
      for (size_t n = 0; n < 2; ++n) {
        std::vector<double> hn(hv.begin() + n * 4, hv.begin() + n * 4 + 4);
        std::vector<double> cn(cv.begin() + n * 4, cv.begin() + n * 4 + 4);
        reference_step(kind, w, &xv[n * 3], hn, cn);
        want_h.insert(want_h.end(), hn.begin(), hn.end());
        want_c.insert(want_c.end(), cn.begin(), cn.end());
        std::vector<double> h_zero(4, 0.0), c_zero(4, 0.0);
        reference_step(kind, w, &xv[n * 3], h_zero, c_zero);
        zero_h.insert(zero_h.end(), h_zero.begin(), h_zero.end());
      }
      for (DType dt : {kFloat64, kFloat32}) {
        SCOPED_TRACE(dtype_name(dt));
        cell->to(dt);
        const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
        const nn::LSTMState next = run_cell(*cell, kind, x.to(dt), h.to(dt), lstm ? c.to(dt) : Tensor());
        EXPECT_EQ(next.h.shape(), (Shape{2, 4}));
        EXPECT_TRUE(all_close(next.h, want_h, tol, tol));
        if (lstm) EXPECT_TRUE(all_close(next.c, want_c, tol, tol));
        EXPECT_TRUE(all_close((*cell)(x.to(dt)), zero_h, tol, tol));
        // unbatched: the first row
        const nn::LSTMState row = run_cell(*cell, kind, x[0].to(dt), h[0].to(dt), lstm ? c[0].to(dt) : Tensor());
        EXPECT_EQ(row.h.shape(), (Shape{4}));
        EXPECT_TRUE(all_close(row.h, std::vector<double>(want_h.begin(), want_h.begin() + 4), tol, tol));
        if (lstm) EXPECT_TRUE(all_close(row.c, std::vector<double>(want_c.begin(), want_c.begin() + 4), tol, tol));
      }
    }
}

TEST(RecurrentCells, FiniteDifferenceGradients) {
  for (Kind kind : kKinds) {
    SCOPED_TRACE(kind_name(kind));
    const bool lstm = kind == Kind::Lstm;
    Generator g(47);
    std::unique_ptr<nn::RNNCellBase> cell = make_cell(kind, 3, 2, true, &g);
    cell->to(kFloat64);
    std::vector<Tensor> inputs = {leaf(randn({2, 3}, kFloat64, &g)), leaf(randn({2, 2}, kFloat64, &g))};
    if (lstm) inputs.push_back(leaf(randn({2, 2}, kFloat64, &g)));
    for (const Tensor& p : cell->parameters()) inputs.push_back(p);
    auto f = [&](V in) {
      const nn::LSTMState next = run_cell(*cell, kind, in[0], in[1], lstm ? in[2] : Tensor());
      return lstm ? cat({next.h, next.c}, 0) : next.h;
    };
    EXPECT_TRUE(gradcheck(f, inputs));
  }
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(Recurrent, BadConfigurationRaises) {
  EXPECT_TRUE(throws_with([] { nn::RNN(3, 4, {.nonlinearity = "gelu"}); }, {"[RNN]", "nonlinearity", "\"gelu\""}));
  EXPECT_TRUE(throws_with([] { nn::LSTM(3, 4, {.num_layers = 0}); },
                          {"[LSTM(3, 4, num_layers=0)]", "num_layers must be positive, got 0"}));
  EXPECT_TRUE(throws_with([] { nn::GRU(3, 0); }, {"[GRU(3, 0)]", "hidden_size must be positive, got 0"}));
  EXPECT_TRUE(throws_with([] { nn::GRU(-1, 3); }, {"[GRU(-1, 3)]", "input_size must be positive"}));
  EXPECT_TRUE(throws_with([] { nn::LSTM(3, 4, {.dropout = 1}); }, {"[LSTM", "dropout must be in [0, 1), got 1"}));
  EXPECT_TRUE(throws_with([] { nn::RNN(3, 4, {.dropout = -0.1}); }, {"[RNN", "dropout must be in [0, 1)"}));
  EXPECT_TRUE(throws_with([] { nn::RNNCell(3, 4, {.nonlinearity = "sigmoid"}); },
                          {"[RNNCell]", "\"tanh\" or \"relu\""}));
  EXPECT_TRUE(throws_with([] { nn::LSTMCell(3, 0); }, {"[LSTMCell]", "hidden_size must be positive"}));
  EXPECT_TRUE(throws_with([] { nn::GRUCell(0, 3); }, {"[GRUCell]", "input_size must be positive"}));
}

TEST(Recurrent, BadInputRaises) {
  nn::LSTM lstm(3, 4, {.num_layers = 2});
  const Tensor x = randn({5, 2, 3}), h0 = randn({2, 2, 4}), c0 = randn({2, 2, 4});
  const char* layer = "[LSTM(3, 4, num_layers=2)]";
  EXPECT_TRUE(throws_with([&] { lstm(randn({5, 2, 3, 1})); }, {layer, "(L, N, 3) or unbatched (L, 3)", "4-d"}));
  EXPECT_TRUE(throws_with([&] { lstm(randn({3})); }, {layer, "1-d input"}));
  EXPECT_TRUE(throws_with([&] { lstm(randn({5, 2, 4})); }, {layer, "expects 3 input features"}));
  EXPECT_TRUE(throws_with([&] { lstm(randn({0, 2, 3})); }, {layer, "at least one step"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, randn({1, 2, 4}), c0); },
                          {layer, "h0 of shape [2, 2, 4]", "got [1, 2, 4]"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, h0, randn({2, 3, 4})); }, {layer, "c0 of shape"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, h0); }, {layer, "h0 and c0 must be given together"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, h0.to(kFloat64), c0); }, {layer, "h0 is float64"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(randn({5, 3}), h0.narrow(1, 0, 1), c0.narrow(1, 0, 1)); },
                          {layer, "(num_layers * num_directions, hidden_size)"}));
  nn::GRU gru(3, 4, {.batch_first = true});
  EXPECT_TRUE(throws_with([&] { gru(randn({2, 5, 3, 1})); }, {"[GRU(3, 4, batch_first=True)]", "(N, L, 3)"}));
  EXPECT_TRUE(throws_with([&] { gru.forward_with_state(randn({2, 5, 3}), randn({1, 2, 4}), randn({1, 2, 4})); },
                          {"[GRU", "c0 must not be given"}));

  nn::GRUCell cell(3, 4);
  EXPECT_TRUE(throws_with([&] { cell(randn({2, 2, 3})); }, {"[GRUCell]", "(N, 3) or (3)", "3-d"}));
  EXPECT_TRUE(throws_with([&] { cell(randn({2, 4})); }, {"[GRUCell]", "expects 3 input features"}));
  EXPECT_TRUE(throws_with([&] { cell.forward(randn({2, 3}), randn({3, 4})); }, {"[GRUCell]", "hx of shape [2, 4]"}));
  EXPECT_TRUE(throws_with([&] { cell.forward(randn({3}), randn({1, 4})); }, {"[GRUCell]", "hx of shape [4]"}));
  nn::LSTMCell lstm_cell(3, 4);
  EXPECT_TRUE(throws_with([&] { lstm_cell.forward_with_state(randn({2, 3}), randn({2, 4})); },
                          {"[LSTMCell]", "hx and cx must be given together"}));
  EXPECT_TRUE(throws_with([&] { lstm_cell.forward_with_state(randn({2, 3}), randn({2, 4}), randn({2, 5})); },
                          {"[LSTMCell]", "cx of shape [2, 4]"}));
}
