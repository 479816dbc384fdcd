// Dynamically quantized recurrent layers in a model: the error against the float model after
// training, the state dict onto a freshly converted model, the options, and the errors.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::max_abs_diff;
using st::testing::throws_with;
using st::testing::values;

namespace {

// Next-value prediction of noisy sine waves: an LSTM and a Linear head on its output.
struct SineNet : st::nn::Module {
  st::nn::LSTM lstm{1, 32, {.num_layers = 2}};
  st::nn::Linear head{32, 1};
  SineNet() {
    register_module("lstm", lstm);
    register_module("head", head);
  }
  st::Tensor forward(const st::Tensor& x) override { return head(lstm(x)); }  // (L, N, 1)
};

// Sequences (L + 1, N, 1) of sin(f t + phase) with random f and phase.
st::Tensor sine_batch(int64_t L, int64_t N) {
  const st::Tensor t = st::arange(0, static_cast<double>(L + 1)).reshape({L + 1, 1, 1});
  const st::Tensor f = st::rand({1, N, 1}) * 0.4 + 0.1, phase = st::rand({1, N, 1}) * 6.28;
  return st::sin(t * f + phase);
}

}  // namespace

TEST(QuantRecurrentModel, TrainedLstmStaysNearTheFloatModel) {
  st::manual_seed(81);
  SineNet net;
  st::optim::Adam opt(net.parameters(), {.lr = 1e-2});
  for (int step = 0; step < 150; ++step) {
    const st::Tensor s = sine_batch(24, 16);
    const st::Tensor loss = st::nn::functional::mse_loss(net(s.narrow(0, 0, 24)), s.narrow(0, 1, 24));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  net.eval();
  const st::NoGradGuard no_grad;
  const st::Tensor s = sine_batch(64, 32), x = s.narrow(0, 0, 64), target = s.narrow(0, 1, 64);
  const st::Tensor float_hidden = net.lstm(x), float_out = net(x);
  const double float_loss = st::nn::functional::mse_loss(float_out, target).item<double>();
  ASSERT_LT(float_loss, 0.01);  // trained: the bound below is about a model that learned something
  SineNet qnet;
  qnet.load_state_dict(net.state_dict());
  qnet.eval();
  EXPECT_EQ(q::quantize_dynamic(qnet), 2);  // the LSTM and the head
  const double hidden_err = max_abs_diff(qnet.lstm(x), float_hidden);
  const double out_err = max_abs_diff(qnet(x), float_out);
  const double q_loss = st::nn::functional::mse_loss(qnet(x), target).item<double>();
  // documented in docs/quantization.md (0.031, 0.076, mse 0.0018 against 0.0014): 64 steps, 2
  // layers of 32, h in (-1, 1), the outputs in about (-1, 1)
  EXPECT_LT(hidden_err, 0.05);
  EXPECT_LT(out_err, 0.1);
  EXPECT_LT(q_loss, float_loss * 1.5 + 1e-4);
  EXPECT_GT(hidden_err, 0);  // the weights and activations were quantized
  std::printf("int8 LSTM: max |h - h_float| %.4f, max |y - y_float| %.4f, mse %.5f (float %.5f)\n", hidden_err,
              out_err, q_loss, float_loss);
}

TEST(QuantRecurrentModel, StateDictLoadsIntoAFreshlyConvertedModel) {
  st::manual_seed(82);
  const st::NoGradGuard no_grad;
  st::nn::LSTM a(3, 5, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
  st::nn::LSTM b(3, 5, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
  q::quantize_dynamic(a);
  q::quantize_dynamic(b);
  const st::nn::StateDict sd = a.state_dict();
  EXPECT_TRUE(sd.count("quantized.weight_hr_l1_reverse_int8"));
  EXPECT_TRUE(sd.count("quantized.weight_ih_l0_scale"));
  EXPECT_TRUE(sd.count("bias_hh_l1"));
  EXPECT_FALSE(sd.count("weight_ih_l0"));  // the float weights are gone
  EXPECT_EQ(sd.at("quantized.weight_ih_l1_int8").dtype(), st::kInt8);
  EXPECT_EQ(sd.at("quantized.weight_ih_l1_int8").shape(), (st::Shape{20, 4}));
  const st::Tensor x = st::randn({4, 2, 3});
  EXPECT_NE(values(a.forward(x)), values(b.forward(x)));
  b.load_state_dict(sd);
  EXPECT_EQ(values(a.forward(x)), values(b.forward(x)));  // the row sums follow the loaded codes
  st::nn::LSTM f(3, 5, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
  EXPECT_THROW(f.load_state_dict(sd), st::Error);  // a float layer has no place for the codes
}

TEST(QuantRecurrentModel, OptionsChooseTheLayers) {
  st::nn::Sequential seq(st::nn::GRU(3, 4), st::nn::LSTM(4, 4));
  EXPECT_EQ(q::quantize_dynamic(seq, {.recurrent = q::RecurrentDtype::None}), 0);
  EXPECT_EQ(q::quantize_dynamic(seq, {.recurrent_filter = [](const std::string& name, const st::nn::Module&) {
                                        return name == "1";
                                      }}),
            1);
  EXPECT_EQ(dynamic_cast<st::nn::GRU&>(seq[0]).form(), nullptr);
  EXPECT_NE(dynamic_cast<st::nn::LSTM&>(seq[1]).form(), nullptr);
  EXPECT_TRUE(dynamic_cast<st::nn::GRU&>(seq[0]).all_weights[0].weight_ih.defined());
  EXPECT_FALSE(dynamic_cast<st::nn::LSTM&>(seq[1]).all_weights[0].weight_ih.defined());
}

TEST(QuantRecurrentModel, DropoutRunsInTrainingOnly) {
  st::manual_seed(83);
  const st::NoGradGuard no_grad;
  st::nn::GRU gru(3, 16, {.num_layers = 2, .dropout = 0.5});
  q::quantize_dynamic(gru);
  gru.eval();
  const st::Tensor x = st::randn({4, 2, 3});
  const std::vector<double> eval_out = values(gru.forward(x));
  EXPECT_EQ(values(gru.forward(x)), eval_out);
  gru.train();
  EXPECT_NE(values(gru.forward(x)), eval_out);
}

TEST(QuantRecurrentModel, BadInputRaises) {
  st::manual_seed(84);
  st::nn::LSTM lstm(3, 4, {.num_layers = 2});
  st::nn::LSTMCell cell(3, 4);
  q::quantize_dynamic(lstm);
  q::quantize_dynamic(cell);
  // no autograd through the int8 products
  const st::Tensor x = st::randn({5, 2, 3}).requires_grad_(true);
  EXPECT_TRUE(throws_with([&] { lstm.forward(x); }, {"computes without autograd"}));
  EXPECT_TRUE(throws_with([&] { cell.forward(x[0]); }, {"computes without autograd"}));
  const st::Tensor h0 = st::zeros({2, 2, 4}).requires_grad_(true), c0 = st::zeros({2, 2, 4});
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(x.detach(), h0, c0); }, {"must not require grad"}));
  const auto packed = st::nn::utils::rnn::pack_padded_sequence(x, {5, 3}, false, true);
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(packed); }, {"computes without autograd"}));
  {
    const st::NoGradGuard no_grad;  // under no_grad the same call runs
    EXPECT_EQ(lstm.forward_with_state(x, h0, c0).output.shape(), (st::Shape{5, 2, 4}));
  }
  // the layer's own checks
  const st::NoGradGuard no_grad;
  EXPECT_TRUE(throws_with([&] { lstm.forward(st::randn({5, 2, 7})); }, {"expects 3 input features"}));
  EXPECT_TRUE(throws_with([&] { lstm.forward_with_state(st::randn({5, 2, 3}), st::zeros({2, 2, 4})); },
                          {"must be given together"}));
  // converting twice, forms twice
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(lstm); }, {"is quantized already"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(cell); }, {"is quantized already"}));
  st::nn::GRU wide(70000, 2);
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(wide); }, {"past which int8 sums could overflow"}));
  EXPECT_TRUE(wide.all_weights[0].weight_ih.defined());  // refused before converting
}
