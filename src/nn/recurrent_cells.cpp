// RNNCell, LSTMCell and GRUCell, and the one-step updates that the recurrent layers
// (nn/recurrent.cpp) also run at every time step.
#include <cmath>

#include <strata/nn/functional.hpp>
#include <strata/nn/init.hpp>
#include <strata/nn/recurrent.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/unary.hpp>

#include "nn/recurrent_internal.h"

namespace strata::nn {

// ---- the steps ---------------------------------------------------------------------------------

namespace detail {

Tensor rnn_step(const Tensor& xw, const Tensor& hw, bool relu) {
  const Tensor pre = xw + hw;
  return relu ? strata::relu(pre) : strata::tanh(pre);
}

LSTMState lstm_step(const Tensor& xw, const Tensor& hw, const Tensor& c) {
  const std::vector<Tensor> gates = (xw + hw).chunk(4, -1);  // i, f, g, o
  const Tensor i = strata::sigmoid(gates[0]), f = strata::sigmoid(gates[1]);
  const Tensor g = strata::tanh(gates[2]), o = strata::sigmoid(gates[3]);
  const Tensor c_next = f * c + i * g;
  return {o * strata::tanh(c_next), c_next};
}

Tensor gru_step(const Tensor& xw, const Tensor& hw, const Tensor& h) {
  // n takes r * (W_hn h + b_hn): the hidden projection is gated before it meets the input's, so
  // unlike RNN and LSTM the two are not summed first
  const std::vector<Tensor> x = xw.chunk(3, -1);  // r, z, n
  const std::vector<Tensor> hh = hw.chunk(3, -1);
  const Tensor r = strata::sigmoid(x[0] + hh[0]), z = strata::sigmoid(x[1] + hh[1]);
  const Tensor n = strata::tanh(x[2] + r * hh[2]);
  return (1 - z) * n + z * h;
}

void check_new_form(const std::string& layer, const RecurrentForm* current, const RecurrentForm* form) {
  STRATA_CHECK(form != nullptr, "[{}] the form is null", layer);
  STRATA_CHECK(current == nullptr, "[{}] already has the form {}; a layer takes one form", layer, current->name());
}

void check_not_form(const std::string& layer, const Module* child, const RecurrentForm* form) {
  STRATA_CHECK(child == nullptr || child != form, "[{}] its form is replaced through set_form, not set_submodule",
               layer);
}

void check_recurrent_sizes(const std::string& layer, int64_t input_size, int64_t hidden_size) {
  STRATA_CHECK(input_size > 0, "[{}] input_size must be positive, got {}", layer, input_size);
  STRATA_CHECK(hidden_size > 0, "[{}] hidden_size must be positive, got {}", layer, hidden_size);
}

void check_nonlinearity(const std::string& layer, const std::string& nonlinearity) {
  STRATA_CHECK(nonlinearity == "tanh" || nonlinearity == "relu",
               "[{}] nonlinearity must be \"tanh\" or \"relu\", got \"{}\"", layer, nonlinearity);
}

void init_recurrent_parameters(const std::vector<Tensor>& parameters, int64_t hidden_size, Generator* gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor p : parameters) init::uniform_(p, -bound, bound, gen);
}

}  // namespace detail

// ---- the cells ---------------------------------------------------------------------------------

namespace {

// The input as (N, input_size): an unbatched (input_size) one gains a batch dim of 1.
Tensor batched_input(const RNNCellBase& cell, const Tensor& input) {
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", cell.name());
  STRATA_CHECK(input.dim() == 1 || input.dim() == 2,
               "[{}] expects an input of shape (N, {}) or ({}), got a {}-d input of shape {}", cell.name(),
               cell.input_size, cell.input_size, input.dim(), input.shape());
  STRATA_CHECK(input.size(-1) == cell.input_size, "[{}] expects {} input features, got input of shape {}",
               cell.name(), cell.input_size, input.shape());
  return input.dim() == 1 ? input.unsqueeze(0) : input;
}

// A state (hx or cx) as (N, hidden_size) for x = batched_input(input): zeros when not given.
Tensor batched_state(const RNNCellBase& cell, const char* what, const Tensor& state, const Tensor& input,
                     const Tensor& x) {
  if (!state.defined()) return zeros({x.size(0), cell.hidden_size}, x.options());
  const bool unbatched = input.dim() == 1;
  const Shape want = unbatched ? Shape{cell.hidden_size} : Shape{x.size(0), cell.hidden_size};
  STRATA_CHECK(state.shape() == want, "[{}] expects {} of shape {} for an input of shape {}, got {}", cell.name(),
               what, want, input.shape(), state.shape());
  STRATA_CHECK(state.dtype() == input.dtype() && state.device() == input.device(),
               "[{}] {} is {} on {} but the input is {} on {}", cell.name(), what, state.dtype(), state.device(),
               input.dtype(), input.device());
  return unbatched ? state.unsqueeze(0) : state;
}

}  // namespace

RNNCellBase::RNNCellBase(const std::string& layer, int64_t gates, int64_t in, int64_t hidden, bool bias,
                         Generator* gen)
    : input_size(in), hidden_size(hidden) {
  detail::check_recurrent_sizes(layer, in, hidden);
  weight_ih = register_parameter("weight_ih", empty({gates * hidden, in}));
  weight_hh = register_parameter("weight_hh", empty({gates * hidden, hidden}));
  if (bias) {
    bias_ih = register_parameter("bias_ih", empty({gates * hidden}));
    bias_hh = register_parameter("bias_hh", empty({gates * hidden}));
  }
  reset_parameters(gen);
}

void RNNCellBase::reset_parameters(Generator* gen) {
  detail::init_recurrent_parameters(parameters(), hidden_size, gen);
}

RecurrentForm& RNNCellBase::set_form(std::string name, std::unique_ptr<RecurrentForm> form) {
  detail::check_new_form(this->name(), form_, form.get());
  form_ = &register_module(std::move(name), std::move(form));
  unregister("weight_ih");
  unregister("weight_hh");
  weight_ih = weight_hh = Tensor();
  return *form_;
}

void RNNCellBase::replacing_child(Module* old, Module*) { detail::check_not_form(name(), old, form_); }

Tensor RNNCellBase::project(RecurrentWeight which, const Tensor& x, const Tensor& bias) const {
  STRATA_CHECK(which != RecurrentWeight::Projection, "[{}] a cell has no projection weight", name());
  if (form_) return form_->project(0, which, x, bias);
  return functional::linear(x, which == RecurrentWeight::InputHidden ? weight_ih : weight_hh, bias);
}

RNNCell::RNNCell(int64_t in, int64_t hidden, RNNCellOptions options)
    : RNNCellBase("RNNCell", 1, in, hidden, options.bias, options.generator), nonlinearity(options.nonlinearity) {
  detail::check_nonlinearity(name(), nonlinearity);
}

Tensor RNNCell::forward(const Tensor& input, const Tensor& hx) {
  const Tensor x = batched_input(*this, input);
  const Tensor h = batched_state(*this, "hx", hx, input, x);
  if (form()) form()->check_inputs(name(), {input, hx});
  const Tensor xw = project(RecurrentWeight::InputHidden, x, bias_ih);
  const Tensor hw = project(RecurrentWeight::HiddenHidden, h, bias_hh);
  const Tensor next = detail::rnn_step(xw, hw, nonlinearity == "relu");
  return input.dim() == 1 ? next.squeeze(0) : next;
}

LSTMCell::LSTMCell(int64_t in, int64_t hidden, LSTMCellOptions options)
    : RNNCellBase("LSTMCell", 4, in, hidden, options.bias, options.generator) {}

Tensor RNNCell::operator()(const Tensor& input, const Tensor& hx) {
  if (!hooks_active()) return forward(input, hx);
  return call_hooked({input, hx}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1]); });
}

LSTMState LSTMCell::operator()(const Tensor& input, const Tensor& hx, const Tensor& cx) {
  if (!hooks_active()) return forward_with_state(input, hx, cx);
  std::vector<Tensor> out = call_hooked({input, hx, cx}, [&](const std::vector<Tensor>& in) {
    LSTMState s = forward_with_state(in[0], in[1], in[2]);
    return std::vector<Tensor>{s.h, s.c};
  });
  return {out[0], out[1]};
}

LSTMState LSTMCell::forward_with_state(const Tensor& input, const Tensor& hx, const Tensor& cx) {
  const Tensor x = batched_input(*this, input);
  STRATA_CHECK(hx.defined() == cx.defined(), "[LSTMCell] hx and cx must be given together, got only {}",
               hx.defined() ? "hx" : "cx");
  const Tensor h = batched_state(*this, "hx", hx, input, x), c = batched_state(*this, "cx", cx, input, x);
  if (form()) form()->check_inputs(name(), {input, hx, cx});
  LSTMState next = detail::lstm_step(project(RecurrentWeight::InputHidden, x, bias_ih),
                                     project(RecurrentWeight::HiddenHidden, h, bias_hh), c);
  if (input.dim() == 1) next = {next.h.squeeze(0), next.c.squeeze(0)};
  return next;
}

GRUCell::GRUCell(int64_t in, int64_t hidden, GRUCellOptions options)
    : RNNCellBase("GRUCell", 3, in, hidden, options.bias, options.generator) {}

Tensor GRUCell::operator()(const Tensor& input, const Tensor& hx) {
  if (!hooks_active()) return forward(input, hx);
  return call_hooked({input, hx}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1]); });
}

Tensor GRUCell::forward(const Tensor& input, const Tensor& hx) {
  const Tensor x = batched_input(*this, input);
  const Tensor h = batched_state(*this, "hx", hx, input, x);
  if (form()) form()->check_inputs(name(), {input, hx});
  const Tensor next = detail::gru_step(project(RecurrentWeight::InputHidden, x, bias_ih),
                                       project(RecurrentWeight::HiddenHidden, h, bias_hh), h);
  return input.dim() == 1 ? next.squeeze(0) : next;
}

}  // namespace strata::nn
