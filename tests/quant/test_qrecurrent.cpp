// Dynamically quantized recurrent layers and cells: the int8 LSTM, GRU and RNN (layers,
// bidirectional, batch_first, proj_size, packed batches, initial states) against a float64
// simulation written here, which quantizes each row of each step's activations with the
// observers' qparams (calculate_qparams, uint8 affine) and takes the weights' int8 codes; float16
// weights against the float layer with its weights rounded to float16; the error against the float
// layer on a trained model; the state dict; and the errors.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
namespace R = strata::nn::utils::rnn;
using st::testing::throws_with;
using st::testing::values;

namespace {

using Vec = std::vector<double>;

// One int8 weight as the form keeps it: codes (out, in) and per-row scales, read from the state dict.
struct QWeight {
  Vec codes, scale;
  int64_t out = 0, in = 0;
};

QWeight qweight(const st::nn::StateDict& sd, const std::string& key) {
  const st::Tensor codes = sd.at(key + "_int8");
  return {values(codes), values(sd.at(key + "_scale")), codes.size(0), codes.size(1)};
}

Vec bias_or_zero(const st::nn::StateDict& sd, const std::string& key, int64_t n) {
  return sd.count(key) ? values(sd.at(key)) : Vec(static_cast<size_t>(n), 0.0);
}

// x (in) as the kernel sees it (float32), quantized to uint8 with its own range, times the
// dequantized weight, plus bias: the dynamic int8 product of one row, in float64.
Vec qlinear(const Vec& x, const QWeight& w, const Vec& bias) {
  std::vector<float> xf(x.begin(), x.end());
  const st::Tensor row = st::from_vector(xf);
  auto [lo, hi] = q::finite_aminmax(row);
  auto [scale, zero] = q::calculate_qparams(lo, hi, q::quant_range(st::kUInt8), false);
  const double s = values(scale)[0];
  const double z = values(zero)[0];
  const Vec codes = values(q::quantize_per_tensor(row, s, static_cast<int64_t>(z), st::kUInt8).int_repr);
  Vec y(static_cast<size_t>(w.out));
  for (int64_t n = 0; n < w.out; ++n) {
    double acc = 0;
    for (int64_t k = 0; k < w.in; ++k) acc += (codes[k] - z) * s * w.codes[n * w.in + k] * w.scale[n];
    y[n] = acc + bias[n];
  }
  return y;
}

double sig(double v) { return 1 / (1 + std::exp(-v)); }

enum class Kind { RNN, LSTM, GRU };

// One gate update in float64 (x: the input's product, hh: h's), PyTorch's gate order.
Vec step(Kind kind, const Vec& xw, const Vec& hw, const Vec& h, Vec& c, int64_t H) {
  Vec out(static_cast<size_t>(H));
  for (int64_t j = 0; j < H; ++j) {
    if (kind == Kind::RNN) {
      out[j] = std::tanh(xw[j] + hw[j]);
    } else if (kind == Kind::LSTM) {
      const double i = sig(xw[j] + hw[j]), f = sig(xw[H + j] + hw[H + j]);
      const double g = std::tanh(xw[2 * H + j] + hw[2 * H + j]), o = sig(xw[3 * H + j] + hw[3 * H + j]);
      c[j] = f * c[j] + i * g;
      out[j] = o * std::tanh(c[j]);
    } else {
      const double r = sig(xw[j] + hw[j]), z = sig(xw[H + j] + hw[H + j]);
      const double n = std::tanh(xw[2 * H + j] + r * hw[2 * H + j]);
      out[j] = (1 - z) * n + z * h[j];
    }
  }
  return out;
}

// The quantized layer over one sequence x (T, F) from states h0 (S, Hs), c0 (S, H), in float64.
struct SimOut {
  std::vector<Vec> output;  // (T) rows of num_directions * Hs
  std::vector<Vec> h_n, c_n;
};

SimOut simulate(Kind kind, const st::nn::RNNBase& layer, const std::vector<Vec>& x, const std::vector<Vec>& h0,
                const std::vector<Vec>& c0) {
  const st::nn::StateDict sd = layer.state_dict();
  const int64_t D = layer.num_directions, H = layer.hidden_size, T = static_cast<int64_t>(x.size());
  const int64_t gates = kind == Kind::LSTM ? 4 : kind == Kind::GRU ? 3 : 1;
  std::vector<Vec> in = x;
  SimOut r;
  for (int64_t l = 0; l < layer.options.num_layers; ++l) {
    std::vector<Vec> out(static_cast<size_t>(T), Vec(static_cast<size_t>(D * layer.state_size)));
    for (int64_t d = 0; d < D; ++d) {
      const int64_t k = l * D + d;
      auto name = [&](st::nn::RecurrentWeight w) { return "quantized." + layer.weight_name(k, w); };
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      const QWeight ih = qweight(sd, name(st::nn::RecurrentWeight::InputHidden));
      const QWeight hh = qweight(sd, name(st::nn::RecurrentWeight::HiddenHidden));
      const Vec b_ih = bias_or_zero(sd, "bias_ih" + sfx, gates * H);
      const Vec b_hh = bias_or_zero(sd, "bias_hh" + sfx, gates * H);
      Vec h = h0[k], c = kind == Kind::LSTM ? c0[k] : Vec();
      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = d == 0 ? i : T - 1 - i;
        h = step(kind, qlinear(in[t], ih, b_ih), qlinear(h, hh, b_hh), h, c, H);
        if (layer.options.proj_size > 0)
          h = qlinear(h, qweight(sd, name(st::nn::RecurrentWeight::Projection)), Vec(h.size(), 0.0));
        std::copy(h.begin(), h.end(), out[t].begin() + d * layer.state_size);
      }
      r.h_n.push_back(h);
      r.c_n.push_back(c);
    }
    in = out;
  }
  r.output = in;
  return r;
}

// Row b of a (S, B, F) state tensor's values, per S.
std::vector<Vec> state_rows(const st::Tensor& s, int64_t b) {
  std::vector<Vec> out;
  for (int64_t k = 0; k < s.size(0); ++k) out.push_back(values(s[k][b]));
  return out;
}

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << what << " at " << i;
}

// The padded output (T, N, *) and the states of `layer` against the simulation, sequence by sequence
// (rows are quantized independently, so a batch is its sequences run alone).
void check_padded(Kind kind, st::nn::RNNBase& layer, int64_t T, int64_t N, const std::string& what) {
  const st::Tensor x = st::randn({T, N, layer.input_size});
  const st::Tensor h0 = st::randn({layer.options.num_layers * layer.num_directions, N, layer.state_size}) * 0.5;
  const st::Tensor c0 = st::randn({h0.size(0), N, layer.hidden_size}) * 0.5;
  const bool lstm = kind == Kind::LSTM;
  const st::Tensor input = layer.options.batch_first ? x.transpose(0, 1).contiguous() : x;
  st::nn::RNNOutput got = layer.forward_with_state(input, h0, lstm ? c0 : st::Tensor());
  const st::Tensor out = layer.options.batch_first ? got.output.transpose(0, 1) : got.output;
  for (int64_t b = 0; b < N; ++b) {
    std::vector<Vec> seq;
    for (int64_t t = 0; t < T; ++t) seq.push_back(values(x[t][b]));
    const SimOut want = simulate(kind, layer, seq, state_rows(h0, b), state_rows(c0, b));
    for (int64_t t = 0; t < T; ++t) expect_close(values(out[t][b]), want.output[t], 2e-6, what + " output");
    for (int64_t k = 0; k < h0.size(0); ++k) {
      expect_close(values(got.h_n[k][b]), want.h_n[k], 2e-6, what + " h_n");
      if (lstm) expect_close(values(got.c_n[k][b]), want.c_n[k], 2e-6, what + " c_n");
    }
  }
}

}  // namespace

TEST(QuantRecurrent, Int8LstmEqualsTheSimulation) {
  st::manual_seed(71);
  const st::NoGradGuard no_grad;
  struct Case {
    st::nn::LSTMOptions o;
    const char* what;
  };
  for (const Case& c : {Case{{}, "plain"}, Case{{.num_layers = 2, .bidirectional = true}, "2 layers, bidirectional"},
                        Case{{.batch_first = true, .proj_size = 3}, "batch_first, proj_size"},
                        Case{{.num_layers = 2, .bias = false, .bidirectional = true, .proj_size = 4}, "no bias"}}) {
    st::nn::LSTM lstm(5, 7, c.o);
    EXPECT_EQ(q::quantize_dynamic(lstm), 1);
    check_padded(Kind::LSTM, lstm, 6, 3, c.what);
  }
}

TEST(QuantRecurrent, Int8GruAndRnnEqualTheSimulation) {
  st::manual_seed(72);
  const st::NoGradGuard no_grad;
  st::nn::GRU gru(6, 8, {.num_layers = 2, .batch_first = true, .bidirectional = true});
  q::quantize_dynamic(gru);
  check_padded(Kind::GRU, gru, 5, 3, "GRU");
  st::nn::RNN rnn(4, 9, {.num_layers = 2});
  q::quantize_dynamic(rnn);
  check_padded(Kind::RNN, rnn, 7, 2, "RNN");
}

TEST(QuantRecurrent, PackedBatchEqualsEachSequenceAlone) {
  st::manual_seed(73);
  const st::NoGradGuard no_grad;
  st::nn::LSTM lstm(4, 6, {.num_layers = 2, .bidirectional = true, .proj_size = 3});
  q::quantize_dynamic(lstm);
  const std::vector<int64_t> lengths{3, 6, 1, 4};
  const int64_t B = 4, S = 4;
  const st::Tensor x = st::randn({6, B, 4}), h0 = st::randn({S, B, 3}), c0 = st::randn({S, B, 6});
  st::nn::PackedRNNOutput got = lstm.forward_with_state(R::pack_padded_sequence(x, lengths, false, false), h0, c0);
  const st::Tensor out = R::pad_packed_sequence(got.output).padded;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Vec> seq;
    for (int64_t t = 0; t < lengths[b]; ++t) seq.push_back(values(x[t][b]));
    const SimOut want = simulate(Kind::LSTM, lstm, seq, state_rows(h0, b), state_rows(c0, b));
    for (int64_t t = 0; t < lengths[b]; ++t) expect_close(values(out[t][b]), want.output[t], 2e-6, "packed output");
    for (int64_t k = 0; k < S; ++k) {
      expect_close(values(got.h_n[k][b]), want.h_n[k], 2e-6, "packed h_n");
      expect_close(values(got.c_n[k][b]), want.c_n[k], 2e-6, "packed c_n");
    }
  }
}

TEST(QuantRecurrent, CellsEqualTheSimulation) {
  st::manual_seed(74);
  const st::NoGradGuard no_grad;
  st::nn::LSTMCell lstm(5, 6);
  st::nn::GRUCell gru(5, 6);
  st::nn::RNNCell rnn(5, 6);
  for (st::nn::Module* m : std::vector<st::nn::Module*>{&lstm, &gru, &rnn}) EXPECT_EQ(q::quantize_dynamic(*m), 1);
  const st::Tensor x = st::randn({3, 5}), h = st::randn({3, 6}), c = st::randn({3, 6});
  const st::nn::LSTMState ls = lstm.forward_with_state(x, h, c);
  const st::Tensor gh = gru.forward(x, h), rh = rnn.forward(x, h);
  for (int64_t b = 0; b < 3; ++b) {
    const Vec xb = values(x[b]), hb = values(h[b]);
    auto qw = [](const st::nn::Module& m, const char* w) {
      return qweight(m.state_dict(), std::string("quantized.") + w);
    };
    auto bias = [](const st::nn::Module& m, const char* k) { return values(m.state_dict().at(k)); };
    auto run = [&](Kind kind, const st::nn::Module& m, Vec& cell) {
      return step(kind, qlinear(xb, qw(m, "weight_ih"), bias(m, "bias_ih")),
                  qlinear(hb, qw(m, "weight_hh"), bias(m, "bias_hh")), hb, cell, 6);
    };
    Vec cb = values(c[b]), none;
    expect_close(values(ls.h[b]), run(Kind::LSTM, lstm, cb), 2e-6, "LSTMCell h");
    expect_close(values(ls.c[b]), cb, 2e-6, "LSTMCell c");
    expect_close(values(gh[b]), run(Kind::GRU, gru, none), 2e-6, "GRUCell");
    expect_close(values(rh[b]), run(Kind::RNN, rnn, none), 2e-6, "RNNCell");
  }
  EXPECT_EQ(values(lstm.forward(x[0])), values(lstm.forward(x.narrow(0, 0, 1))[0]));  // unbatched
}

TEST(QuantRecurrent, Float16WeightsEqualTheFloatLayerWithRoundedWeights) {
  st::manual_seed(75);
  const st::NoGradGuard no_grad;
  st::nn::GRU ref(4, 5, {.num_layers = 2, .bidirectional = true}), half(4, 5, {.num_layers = 2, .bidirectional = true});
  half.load_state_dict(ref.state_dict());
  for (auto& [name, p] : ref.named_parameters())
    if (name.rfind("weight", 0) == 0) p.copy_(p.to(st::kFloat16).to(st::kFloat32));
  EXPECT_EQ(q::quantize_dynamic(half, {.recurrent = q::RecurrentDtype::Float16}), 1);
  EXPECT_EQ(half.state_dict().at("quantized.weight_hh_l1_reverse_fp16").dtype(), st::kFloat16);
  const st::Tensor x = st::randn({5, 2, 4});
  expect_close(values(half.forward(x)), values(ref.forward(x)), 1e-6, "float16 GRU");
}
