// RNN, LSTM and GRU: PyTorch's parameters for every layer and direction, the input and state
// checks that name the layer, and the loop over layers, directions and time steps. Each layer
// projects the whole sequence through weight_ih in one matmul; only the hidden projection runs
// step by step (the steps are in nn/recurrent_cells.cpp).
#include <fmt/format.h>

#include <strata/nn/functional.hpp>
#include <strata/nn/recurrent.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "nn/recurrent_internal.h"

namespace strata::nn {

namespace {

// "LSTM(10, 20, num_layers=2, bidirectional=True)", as PyTorch prints the layer.
std::string describe(const std::string& layer, int64_t in, int64_t hidden, const RecurrentOptions& o) {
  std::string s = fmt::format("{}({}, {}", layer, in, hidden);
  if (o.num_layers != 1) s += fmt::format(", num_layers={}", o.num_layers);
  if (!o.bias) s += ", bias=False";
  if (o.batch_first) s += ", batch_first=True";
  if (o.dropout != 0) s += fmt::format(", dropout={}", o.dropout);
  if (o.bidirectional) s += ", bidirectional=True";
  return s + ")";
}

RecurrentOptions without_nonlinearity(const RNNOptions& o) {
  return {o.num_layers, o.bias, o.batch_first, o.dropout, o.bidirectional, o.generator};
}

}  // namespace

RNNBase::RNNBase(const std::string& layer, int64_t gates, bool with_cell_state, int64_t in, int64_t hidden,
                 RecurrentOptions o)
    : input_size(in),
      hidden_size(hidden),
      num_directions(o.bidirectional ? 2 : 1),
      options(o),
      description_(describe(layer, in, hidden, o)),
      with_cell_state_(with_cell_state) {
  detail::check_recurrent_sizes(description_, in, hidden);
  STRATA_CHECK(o.num_layers > 0, "[{}] num_layers must be positive, got {}", description_, o.num_layers);
  STRATA_CHECK(o.dropout >= 0 && o.dropout < 1, "[{}] dropout must be in [0, 1), got {}", description_, o.dropout);
  // PyTorch's registration order: layer by layer, the forward direction before the reverse
  for (int64_t layer_index = 0; layer_index < o.num_layers; ++layer_index) {
    const int64_t features = layer_index == 0 ? in : num_directions * hidden;
    for (int64_t direction = 0; direction < num_directions; ++direction) {
      const std::string suffix = fmt::format("_l{}{}", layer_index, direction == 1 ? "_reverse" : "");
      RecurrentWeights w;
      w.weight_ih = register_parameter("weight_ih" + suffix, empty({gates * hidden, features}));
      w.weight_hh = register_parameter("weight_hh" + suffix, empty({gates * hidden, hidden}));
      if (o.bias) {
        w.bias_ih = register_parameter("bias_ih" + suffix, empty({gates * hidden}));
        w.bias_hh = register_parameter("bias_hh" + suffix, empty({gates * hidden}));
      }
      all_weights.push_back(w);
    }
  }
  reset_parameters(o.generator);
}

void RNNBase::reset_parameters(Generator* gen) {
  detail::init_recurrent_parameters(parameters(), hidden_size, gen);
}

Tensor RNNBase::forward(const Tensor& input) { return forward_with_state(input).output; }

namespace {

// h0 or c0 as (S, N, H) for x (L, N, input_size): zeros when not given.
Tensor initial_state(const std::string& layer, const char* what, const Tensor& given, const Tensor& input,
                     const Tensor& x, int64_t states, int64_t hidden) {
  const int64_t batch = x.size(1);
  if (!given.defined()) return zeros({states, batch, hidden}, x.options());
  const bool unbatched = input.dim() == 2;
  const Shape want = unbatched ? Shape{states, hidden} : Shape{states, batch, hidden};
  STRATA_CHECK(given.shape() == want,
               "[{}] expects {} of shape {} (num_layers * num_directions, {}hidden_size) for an input of shape {}, "
               "got {}",
               layer, what, want, unbatched ? "" : "N, ", input.shape(), given.shape());
  STRATA_CHECK(given.dtype() == input.dtype() && given.device() == input.device(),
               "[{}] {} is {} on {} but the input is {} on {}", layer, what, given.dtype(), given.device(),
               input.dtype(), input.device());
  return unbatched ? given.unsqueeze(1) : given;
}

}  // namespace

RNNOutput RNNBase::forward_with_state(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  const std::string& layer = description_;
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", layer);
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3,
               "[{}] expects an input of shape ({}, {}) or unbatched (L, {}), got a {}-d input of shape {}", layer,
               options.batch_first ? "N, L" : "L, N", input_size, input_size, input.dim(), input.shape());
  STRATA_CHECK(input.size(-1) == input_size, "[{}] expects {} input features, got input of shape {}", layer,
               input_size, input.shape());
  const bool unbatched = input.dim() == 2;
  const Tensor x = unbatched ? input.unsqueeze(1) : options.batch_first ? input.transpose(0, 1) : input;  // (L, N, in)
  const int64_t steps = x.size(0);
  STRATA_CHECK(steps > 0, "[{}] expects a sequence of at least one step, got input of shape {}", layer,
               input.shape());
  STRATA_CHECK(with_cell_state_ || !c0.defined(), "[{}] has no cell state: c0 must not be given", layer);
  STRATA_CHECK(!with_cell_state_ || h0.defined() == c0.defined(), "[{}] h0 and c0 must be given together, got only {}",
               layer, h0.defined() ? "h0" : "c0");

  const int64_t states = options.num_layers * num_directions;
  const Tensor h_init = initial_state(layer, "h0", h0, input, x, states, hidden_size);  // (S, N, H)
  const Tensor c_init = with_cell_state_ ? initial_state(layer, "c0", c0, input, x, states, hidden_size) : Tensor();

  Tensor layer_input = x;  // (L, N, in), then (L, N, num_directions * H)
  std::vector<Tensor> h_n, c_n;
  for (int64_t layer_index = 0; layer_index < options.num_layers; ++layer_index) {
    if (layer_index > 0)
      layer_input = functional::dropout(layer_input, options.dropout, is_training(), options.generator);
    std::vector<Tensor> outputs;  // per direction, (L, N, H)
    for (int64_t direction = 0; direction < num_directions; ++direction) {
      const int64_t k = layer_index * num_directions + direction;
      const RecurrentWeights& w = all_weights[static_cast<size_t>(k)];
      const Tensor xw = functional::linear(layer_input, w.weight_ih, w.bias_ih);  // (L, N, gates * H)
      Tensor h = h_init[k], c = with_cell_state_ ? c_init[k] : Tensor();
      std::vector<Tensor> hs(static_cast<size_t>(steps));
      for (int64_t i = 0; i < steps; ++i) {
        const int64_t t = direction == 0 ? i : steps - 1 - i;  // the reverse direction reads the sequence backwards
        step(xw[t], w, h, c);
        hs[static_cast<size_t>(t)] = h;
      }
      outputs.push_back(stack(hs, 0));
      h_n.push_back(h);
      if (with_cell_state_) c_n.push_back(c);
    }
    layer_input = num_directions == 1 ? outputs[0] : cat(outputs, 2);
  }

  RNNOutput result{layer_input, stack(h_n, 0), with_cell_state_ ? stack(c_n, 0) : Tensor()};
  if (unbatched) {
    result.output = result.output.squeeze(1);
    result.h_n = result.h_n.squeeze(1);
    if (with_cell_state_) result.c_n = result.c_n.squeeze(1);
  } else if (options.batch_first) {
    result.output = result.output.transpose(0, 1);
  }
  return result;
}

// ---- the three layers --------------------------------------------------------------------------

RNN::RNN(int64_t in, int64_t hidden, RNNOptions o)
    : RNNBase("RNN", 1, false, in, hidden, without_nonlinearity(o)), nonlinearity(o.nonlinearity) {
  detail::check_nonlinearity("RNN", nonlinearity);
}

void RNN::step(const Tensor& xw, const RecurrentWeights& w, Tensor& h, Tensor&) const {
  h = detail::rnn_step(xw, h, w.weight_hh, w.bias_hh, nonlinearity == "relu");
}

LSTM::LSTM(int64_t in, int64_t hidden, LSTMOptions o) : RNNBase("LSTM", 4, true, in, hidden, o) {}

void LSTM::step(const Tensor& xw, const RecurrentWeights& w, Tensor& h, Tensor& c) const {
  LSTMState next = detail::lstm_step(xw, h, c, w.weight_hh, w.bias_hh);
  h = next.h;
  c = next.c;
}

GRU::GRU(int64_t in, int64_t hidden, GRUOptions o) : RNNBase("GRU", 3, false, in, hidden, o) {}

void GRU::step(const Tensor& xw, const RecurrentWeights& w, Tensor& h, Tensor&) const {
  h = detail::gru_step(xw, h, w.weight_hh, w.bias_hh);
}

}  // namespace strata::nn
