// LSTM with proj_size against a float64 step loop of PyTorch's documented equations written
// here (h_t = W_hr (o_t * tanh(c_t))); PyTorch's parameter names, shapes and order (weight_hr_l{k}
// after the biases); state_dict round trips; finite-difference gradients; bad configurations.
#include <cmath>
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

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

struct Sizes {
  int64_t layers, directions, in, hidden, proj, steps, batch;
  int64_t states() const { return layers * directions; }
};

// y = W v + b (b may be empty).
std::vector<double> affine(const Mat& w, const double* v, const std::vector<double>& b) {
  std::vector<double> y(static_cast<size_t>(w.rows), 0.0);
  for (int64_t j = 0; j < w.rows; ++j) {
    y[j] = b.empty() ? 0 : b[j];
    for (int64_t k = 0; k < w.cols; ++k) y[j] += w(j, k) * v[k];
  }
  return y;
}

struct RefOutput {
  std::vector<double> output, h_n, c_n;  // (L, N, D * P), (S, N, P), (S, N, H)
};

// x (L, N, in), h0 (S, N, P), c0 (S, N, H), all C order.
RefOutput reference(const nn::StateDict& sd, const Sizes& s, const std::vector<double>& x,
                    const std::vector<double>& h0, const std::vector<double>& c0) {
  const int64_t L = s.steps, N = s.batch, H = s.hidden, P = s.proj, D = s.directions;
  RefOutput r{{}, h0, c0};
  std::vector<double> in = x;
  int64_t features = s.in;
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    std::vector<double> out(static_cast<size_t>(L * N * D * P));
    for (int64_t d = 0; d < D; ++d) {
      const std::string suffix = "_l" + std::to_string(layer) + (d == 1 ? "_reverse" : "");
      const Mat w_ih(sd.at("weight_ih" + suffix)), w_hh(sd.at("weight_hh" + suffix)), w_hr(sd.at("weight_hr" + suffix));
      auto bias = [&](const std::string& name) {  // empty without bias
        return sd.count(name + suffix) ? values(sd.at(name + suffix)) : std::vector<double>{};
      };
      const std::vector<double> b_ih = bias("bias_ih"), b_hh = bias("bias_hh");
      const int64_t k = layer * D + d;
      for (int64_t n = 0; n < N; ++n) {
        double* h = &r.h_n[static_cast<size_t>((k * N + n) * P)];
        double* c = &r.c_n[static_cast<size_t>((k * N + n) * H)];
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = d == 0 ? i : L - 1 - i;
          const std::vector<double> px = affine(w_ih, &in[static_cast<size_t>((t * N + n) * features)], b_ih);
          const std::vector<double> ph = affine(w_hh, h, b_hh);
          std::vector<double> unprojected(static_cast<size_t>(H));
          for (int64_t j = 0; j < H; ++j) {
            auto pre = [&](int64_t gate) { return px[gate * H + j] + ph[gate * H + j]; };
            const double ig = sigmoid(pre(0)), fg = sigmoid(pre(1)), gg = std::tanh(pre(2)), og = sigmoid(pre(3));
            c[j] = fg * c[j] + ig * gg;
            unprojected[j] = og * std::tanh(c[j]);
          }
          const std::vector<double> projected = affine(w_hr, unprojected.data(), {});
          std::copy(projected.begin(), projected.end(), h);
          std::copy(projected.begin(), projected.end(), out.begin() + ((t * N + n) * D + d) * P);
        }
      }
    }
    in = out;
    features = D * P;
  }
  r.output = in;
  return r;
}

}  // namespace

TEST(LSTMProjection, MatchesReference) {
  const nn::LSTMOptions cases[] = {
      {.proj_size = 2},
      {.num_layers = 2, .bidirectional = true, .proj_size = 3},
      {.num_layers = 2, .bias = false, .batch_first = true, .bidirectional = true, .proj_size = 1},
  };
  for (const nn::LSTMOptions& o : cases) {
    SCOPED_TRACE(fmt::format("layers {} bias {} batch_first {} bidirectional {} proj_size {}", o.num_layers, o.bias,
                             o.batch_first, o.bidirectional, o.proj_size));
    Generator g(61);
    nn::LSTMOptions with_gen = o;
    with_gen.generator = &g;
    nn::LSTM m(3, 5, with_gen);
    const Sizes s{o.num_layers, o.bidirectional ? 2 : 1, 3, 5, o.proj_size, 4, 2};
    EXPECT_EQ(m.state_size, o.proj_size);
    const Tensor x = randn({s.steps, s.batch, s.in}, kFloat32, &g).to(kFloat64);
    const Tensor h0 = randn({s.states(), s.batch, s.proj}, kFloat32, &g).to(kFloat64);
    const Tensor c0 = randn({s.states(), s.batch, s.hidden}, kFloat32, &g).to(kFloat64);
    m.to(kFloat64);
    const RefOutput want = reference(m.state_dict(), s, values(x), values(h0), values(c0));
    for (DType dt : {kFloat64, kFloat32}) {
      SCOPED_TRACE(dtype_name(dt));
      m.to(dt);
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
      const Tensor input = o.batch_first ? x.to(dt).transpose(0, 1) : x.to(dt);
      const nn::RNNOutput out = m.forward_with_state(input, h0.to(dt), c0.to(dt));
      const Tensor y = o.batch_first ? out.output.transpose(0, 1) : out.output;
      EXPECT_EQ(y.shape(), (Shape{s.steps, s.batch, s.directions * s.proj}));
      EXPECT_EQ(out.h_n.shape(), (Shape{s.states(), s.batch, s.proj}));
      EXPECT_EQ(out.c_n.shape(), (Shape{s.states(), s.batch, s.hidden}));
      EXPECT_TRUE(all_close(y, want.output, tol, tol));
      EXPECT_TRUE(all_close(out.h_n, want.h_n, tol, tol));
      EXPECT_TRUE(all_close(out.c_n, want.c_n, tol, tol));
    }
  }
}

TEST(LSTMProjection, ParameterNamesShapesOrderAndStateDict) {
  Generator g(62);
  nn::LSTM lstm(3, 5, {.num_layers = 2, .bidirectional = true, .generator = &g, .proj_size = 2});
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& [name, p] : lstm.named_parameters()) {
    names.push_back(name);
    shapes.push_back(p.shape());
  }
  // torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)'s named_parameters()
  std::vector<std::string> want_names;
  std::vector<Shape> want_shapes;
  for (const char* suffix : {"_l0", "_l0_reverse", "_l1", "_l1_reverse"}) {
    for (const char* base : {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"})
      want_names.push_back(std::string(base) + suffix);
    const int64_t features = std::string(suffix).find("l0") != std::string::npos ? 3 : 4;
    want_shapes.insert(want_shapes.end(), {{20, features}, {20, 2}, {20}, {20}, {2, 5}});
  }
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(shapes, want_shapes);
  EXPECT_TRUE(lstm.all_weights[3].weight_hr.is_same(lstm.named_parameters()[19].second));
  // every parameter U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), weight_hr too
  for (const Tensor& p : lstm.parameters())
    for (double v : values(p)) EXPECT_LE(std::fabs(v), 1 / std::sqrt(5.0));

  nn::LSTM plain(3, 5, {.bias = false, .proj_size = 4});
  std::vector<std::string> plain_names;
  for (const auto& [name, p] : plain.named_parameters()) plain_names.push_back(name);
  EXPECT_EQ(plain_names, (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "weight_hr_l0"}));

  nn::LSTM loaded(3, 5, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
  loaded.load_state_dict(lstm.state_dict());
  const Tensor x = randn({4, 2, 3}, kFloat32, &g);
  EXPECT_TRUE(all_close(loaded(x), values(lstm(x)), 0, 0));
  EXPECT_EQ(loaded(x).shape(), (Shape{4, 2, 4}));
}

TEST(LSTMProjection, FiniteDifferenceGradients) {
  Generator g(63);
  nn::LSTM m(2, 3, {.num_layers = 2, .bidirectional = true, .generator = &g, .proj_size = 2});
  m.to(kFloat64);
  std::vector<Tensor> inputs = {leaf(randn({3, 2, 2}, kFloat64, &g)), leaf(randn({4, 2, 2}, kFloat64, &g)),
                                leaf(randn({4, 2, 3}, kFloat64, &g))};
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  auto f = [&](V in) {
    const nn::RNNOutput r = m.forward_with_state(in[0], in[1], in[2]);
    return cat({r.output.flatten(), r.h_n.flatten(), r.c_n.flatten()}, 0);
  };
  EXPECT_TRUE(gradcheck(f, inputs));
}

TEST(LSTMProjection, BadConfigurationAndStatesRaise) {
  EXPECT_TRUE(throws_with([] { nn::LSTM(3, 4, {.proj_size = 4}); },
                          {"[LSTM(3, 4, proj_size=4)]", "proj_size must be in [0, hidden_size = 4), got 4"}));
  EXPECT_TRUE(throws_with([] { nn::LSTM(3, 4, {.proj_size = -1}); }, {"proj_size must be in", "got -1"}));
  EXPECT_TRUE(throws_with([] { nn::GRU(3, 4, {.proj_size = 2}); }, {"[GRU", "only supported for LSTM"}));
  nn::LSTM lstm(3, 4, {.proj_size = 2});
  const Tensor x = randn({5, 2, 3});
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, randn({1, 2, 4}), randn({1, 2, 4})); },
                          {"h0 of shape [1, 2, 2]", "proj_size", "got [1, 2, 4]"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x, randn({1, 2, 2}), randn({1, 2, 2})); },
                          {"c0 of shape [1, 2, 4]", "hidden_size"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(randn({5, 3}), randn({1, 4}), randn({1, 4})); },
                          {"h0 of shape [1, 2]"}));
}
