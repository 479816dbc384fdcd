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
  if (o.proj_size != 0) s += fmt::format(", proj_size={}", o.proj_size);
  if (o.num_layers != 1) s += fmt::format(", num_layers={}", o.num_layers);
  if (!o.bias) s += ", bias=False";
  if (o.batch_first) s += ", batch_first=True";
  if (o.dropout != 0) s += fmt::format(", dropout={}", o.dropout);
  if (o.bidirectional) s += ", bidirectional=True";
  return s + ")";
}

RecurrentOptions without_nonlinearity(const RNNOptions& o) {
  return {o.num_layers, o.bias, o.batch_first, o.dropout, o.bidirectional, o.generator, 0};
}

}  // namespace

std::string RNNBase::description() const { return describe(layer_, input_size, hidden_size, options); }

RNNBase::RNNBase(const std::string& layer, int64_t gates, bool with_cell_state, int64_t in, int64_t hidden,
                 RecurrentOptions o)
    : input_size(in),
      hidden_size(hidden),
      num_directions(o.bidirectional ? 2 : 1),
      state_size(o.proj_size > 0 ? o.proj_size : hidden),
      options(o),
      layer_(layer),
      with_cell_state_(with_cell_state) {
  detail::check_recurrent_sizes(description(), in, hidden);
  STRATA_CHECK(o.num_layers > 0, "[{}] num_layers must be positive, got {}", description(), o.num_layers);
  STRATA_CHECK(o.dropout >= 0 && o.dropout < 1, "[{}] dropout must be in [0, 1), got {}", description(), o.dropout);
  STRATA_CHECK(o.proj_size == 0 || with_cell_state, "[{}] proj_size is only supported for LSTM, not RNN or GRU",
               description());
  STRATA_CHECK(o.proj_size >= 0 && o.proj_size < hidden, "[{}] proj_size must be in [0, hidden_size = {}), got {}",
               description(), hidden, o.proj_size);
  // PyTorch's registration order: layer by layer, the forward direction before the reverse
  for (int64_t layer_index = 0; layer_index < o.num_layers; ++layer_index) {
    const int64_t features = layer_index == 0 ? in : num_directions * state_size;
    for (int64_t direction = 0; direction < num_directions; ++direction) {
      const std::string suffix = fmt::format("_l{}{}", layer_index, direction == 1 ? "_reverse" : "");
      RecurrentWeights w;
      w.weight_ih = register_parameter("weight_ih" + suffix, empty({gates * hidden, features}));
      w.weight_hh = register_parameter("weight_hh" + suffix, empty({gates * hidden, state_size}));
      if (o.bias) {
        w.bias_ih = register_parameter("bias_ih" + suffix, empty({gates * hidden}));
        w.bias_hh = register_parameter("bias_hh" + suffix, empty({gates * hidden}));
      }
      if (o.proj_size > 0) w.weight_hr = register_parameter("weight_hr" + suffix, empty({o.proj_size, hidden}));
      all_weights.push_back(w);
    }
  }
  reset_parameters(o.generator);
}

void RNNBase::reset_parameters(Generator* gen) {
  detail::init_recurrent_parameters(parameters(), hidden_size, gen);
}

RecurrentForm& RNNBase::set_form(std::string name, std::unique_ptr<RecurrentForm> form) {
  detail::check_new_form(description(), form_, form.get());
  form_ = &register_module(std::move(name), std::move(form));
  for (int64_t k = 0; k < static_cast<int64_t>(all_weights.size()); ++k) {
    RecurrentWeights& w = all_weights[static_cast<size_t>(k)];
    unregister(weight_name(k, RecurrentWeight::InputHidden));
    unregister(weight_name(k, RecurrentWeight::HiddenHidden));
    if (w.weight_hr.defined()) unregister(weight_name(k, RecurrentWeight::Projection));
    w.weight_ih = w.weight_hh = w.weight_hr = Tensor();
  }
  return *form_;
}

void RNNBase::replacing_child(Module* old, Module*) { detail::check_not_form(description(), old, form_); }

std::string RNNBase::weight_name(int64_t k, RecurrentWeight which) const {
  STRATA_CHECK(k >= 0 && k < static_cast<int64_t>(all_weights.size()), "[{}] has no layer and direction {}",
               description(), k);
  const char* kind = which == RecurrentWeight::InputHidden    ? "ih"
                     : which == RecurrentWeight::HiddenHidden ? "hh"
                                                              : "hr";
  return fmt::format("weight_{}_l{}{}", kind, k / num_directions, k % num_directions == 1 ? "_reverse" : "");
}

Tensor RNNBase::project(int64_t k, RecurrentWeight which, const Tensor& x, const Tensor& bias) const {
  if (form_) return form_->project(k, which, x, bias);
  const RecurrentWeights& w = all_weights[static_cast<size_t>(k)];
  const Tensor& weight = which == RecurrentWeight::InputHidden    ? w.weight_ih
                         : which == RecurrentWeight::HiddenHidden ? w.weight_hh
                                                                  : w.weight_hr;
  return functional::linear(x, weight, bias);
}

Tensor RNNBase::hidden_product(int64_t k, const Tensor& h) const {
  return project(k, RecurrentWeight::HiddenHidden, h, all_weights[static_cast<size_t>(k)].bias_hh);
}

Tensor RNNBase::forward(const Tensor& input) { return forward_with_state(input).output; }

utils::rnn::PackedSequence RNNBase::forward(const utils::rnn::PackedSequence& input) {
  return forward_with_state(input).output;
}

RNNOutput RNNBase::operator()(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  if (!hooks_active()) return forward_with_state(input, h0, c0);
  std::vector<Tensor> out = call_hooked({input, h0, c0}, [&](const std::vector<Tensor>& in) {
    RNNOutput r = forward_with_state(in[0], in[1], in[2]);
    return std::vector<Tensor>{r.output, r.h_n, r.c_n};
  });
  return {out[0], out[1], out[2]};
}

PackedRNNOutput RNNBase::operator()(const utils::rnn::PackedSequence& input, const Tensor& h0, const Tensor& c0) {
  if (!hooks_active()) return forward_with_state(input, h0, c0);
  utils::rnn::PackedSequence packed = input;  // its data as the hooks leave it
  PackedRNNOutput result;
  std::vector<Tensor> out = call_hooked({input.data, h0, c0}, [&](const std::vector<Tensor>& in) {
    packed.data = in[0];
    result = forward_with_state(packed, in[1], in[2]);
    return std::vector<Tensor>{result.output.data, result.h_n, result.c_n};
  });
  result.output.data = out[0];
  result.h_n = out[1];
  result.c_n = out[2];
  return result;
}

Tensor RNNBase::initial_state(const char* what, const Tensor& given, const Tensor& input, bool unbatched,
                              int64_t batch, int64_t features) const {
  const int64_t states = options.num_layers * num_directions;
  if (!given.defined()) return zeros({states, batch, features}, input.options());
  const Shape want = unbatched ? Shape{states, features} : Shape{states, batch, features};
  const char* size_name = features == hidden_size ? "hidden_size" : "proj_size";
  STRATA_CHECK(given.shape() == want,
               "[{}] expects {} of shape {} (num_layers * num_directions, {}{}) for an input of shape {}, got {}",
               description(), what, want, unbatched ? "" : "N, ", size_name, input.shape(), given.shape());
  STRATA_CHECK(given.dtype() == input.dtype() && given.device() == input.device(),
               "[{}] {} is {} on {} but the input is {} on {}", description(), what, given.dtype(), given.device(),
               input.dtype(), input.device());
  return unbatched ? given.unsqueeze(1) : given;
}

void RNNBase::check_states_given(const Tensor& h0, const Tensor& c0) const {
  STRATA_CHECK(with_cell_state_ || !c0.defined(), "[{}] has no cell state: c0 must not be given", description());
  STRATA_CHECK(!with_cell_state_ || h0.defined() == c0.defined(),
               "[{}] h0 and c0 must be given together, got only {}", description(), h0.defined() ? "h0" : "c0");
}

RNNOutput RNNBase::forward_with_state(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  const std::string layer = description();
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", layer);
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3,
               "[{}] expects an input of shape ({}, {}) or unbatched (L, {}), got a {}-d input of shape {}", layer,
               options.batch_first ? "N, L" : "L, N", input_size, input_size, input.dim(), input.shape());
  STRATA_CHECK(input.size(-1) == input_size, "[{}] expects {} input features, got input of shape {}", layer,
               input_size, input.shape());
  const bool unbatched = input.dim() == 2;
  const Tensor x = unbatched ? input.unsqueeze(1) : options.batch_first ? input.transpose(0, 1) : input;  // (L, N, in)
  const int64_t steps = x.size(0), batch = x.size(1);
  STRATA_CHECK(steps > 0, "[{}] expects a sequence of at least one step, got input of shape {}", layer,
               input.shape());
  check_states_given(h0, c0);
  if (form_) form_->check_inputs(layer, {input, h0, c0});
  const Tensor h_init = initial_state("h0", h0, input, unbatched, batch, state_size);  // (S, N, H)
  const Tensor c_init = with_cell_state_ ? initial_state("c0", c0, input, unbatched, batch, hidden_size) : Tensor();

  // the padded batch is a packed one whose every step holds the whole batch
  LayersOutput r = run_layers(x.reshape({steps * batch, input_size}), std::vector<int64_t>(steps, batch), h_init,
                              c_init);
  RNNOutput result{r.data.view({steps, batch, r.data.size(1)}), r.h_n, r.c_n};
  if (unbatched) {
    result.output = result.output.squeeze(1);
    result.h_n = result.h_n.squeeze(1);
    if (with_cell_state_) result.c_n = result.c_n.squeeze(1);
  } else if (options.batch_first) {
    result.output = result.output.transpose(0, 1);
  }
  return result;
}

PackedRNNOutput RNNBase::forward_with_state(const utils::rnn::PackedSequence& input, const Tensor& h0,
                                            const Tensor& c0) {
  const detail::PackedLayout l = detail::packed_layout(description(), input);
  const Tensor& x = input.data;
  STRATA_CHECK(x.dim() == 2 && x.size(1) == input_size,
               "[{}] expects packed data of shape (sum of lengths, {}), got {}", description(), input_size, x.shape());
  check_states_given(h0, c0);
  if (form_) form_->check_inputs(description(), {x, h0, c0});
  const int64_t batch = l.batch_sizes[0];
  // the states come in the batch's order and the packed rows in sorted order
  const Tensor& sorted = input.sorted_indices;
  const Tensor unsorted = input.unsorted_indices.defined() || !l.permuted
                              ? input.unsorted_indices
                              : from_vector(l.inverse()).to(sorted.device());
  auto to_sorted = [&](const Tensor& s) { return sorted.defined() ? s.index_select(1, sorted.to(s.device())) : s; };
  auto to_batch = [&](const Tensor& s) { return sorted.defined() ? s.index_select(1, unsorted.to(s.device())) : s; };
  const Tensor h_init = to_sorted(initial_state("h0", h0, x, false, batch, state_size));
  const Tensor c_init =
      with_cell_state_ ? to_sorted(initial_state("c0", c0, x, false, batch, hidden_size)) : Tensor();
  LayersOutput r = run_layers(x, l.batch_sizes, h_init, c_init);
  return {{r.data, input.batch_sizes, sorted, unsorted},
          to_batch(r.h_n),
          with_cell_state_ ? to_batch(r.c_n) : Tensor()};
}

RNNBase::LayersOutput RNNBase::run_layers(const Tensor& x, const std::vector<int64_t>& batch_sizes,
                                          const Tensor& h_init, const Tensor& c_init) {
  const auto steps = static_cast<int64_t>(batch_sizes.size());
  std::vector<int64_t> offsets(batch_sizes.size(), 0);  // each step's first row
  for (size_t t = 1; t < batch_sizes.size(); ++t) offsets[t] = offsets[t - 1] + batch_sizes[t - 1];

  Tensor layer_input = x;  // (rows, in), then (rows, num_directions * H)
  std::vector<Tensor> h_n, c_n;
  for (int64_t layer_index = 0; layer_index < options.num_layers; ++layer_index) {
    if (layer_index > 0)
      layer_input = functional::dropout(layer_input, options.dropout, is_training(), options.generator);
    std::vector<Tensor> outputs;  // per direction, (rows, H)
    for (int64_t direction = 0; direction < num_directions; ++direction) {
      const int64_t k = layer_index * num_directions + direction;
      const RecurrentWeights& w = all_weights[static_cast<size_t>(k)];
      const Tensor xw = project(k, RecurrentWeight::InputHidden, layer_input, w.bias_ih);  // (rows, gates * hidden)
      const Tensor h0 = h_init[k], c0 = with_cell_state_ ? c_init[k] : Tensor();
      std::vector<Tensor> hs(static_cast<size_t>(steps));
      Tensor h, c;
      if (direction == 0) {
        // the shorter sequences (the last rows) stop as the batch shrinks: keep their final states
        h = h0;
        c = c0;
        std::vector<Tensor> done_h, done_c;
        for (int64_t t = 0; t < steps; ++t) {
          const int64_t n = batch_sizes[static_cast<size_t>(t)], running = h.size(0);
          if (n < running) {
            done_h.insert(done_h.begin(), h.narrow(0, n, running - n));
            h = h.narrow(0, 0, n);
            if (with_cell_state_) {
              done_c.insert(done_c.begin(), c.narrow(0, n, running - n));
              c = c.narrow(0, 0, n);
            }
          }
          step(xw.narrow(0, offsets[static_cast<size_t>(t)], n), k, h, c);
          hs[static_cast<size_t>(t)] = h;
        }
        if (!done_h.empty()) {
          done_h.insert(done_h.begin(), h);
          h = cat(done_h, 0);
          if (with_cell_state_) {
            done_c.insert(done_c.begin(), c);
            c = cat(done_c, 0);
          }
        }
      } else {
        // the reverse direction reads each sequence from its own end: a sequence joins at its last step
        const int64_t first = batch_sizes.back();
        h = first < h0.size(0) ? h0.narrow(0, 0, first) : h0;
        c = with_cell_state_ && first < c0.size(0) ? c0.narrow(0, 0, first) : c0;
        for (int64_t t = steps - 1; t >= 0; --t) {
          const int64_t n = batch_sizes[static_cast<size_t>(t)], running = h.size(0);
          if (n > running) {
            h = cat({h, h0.narrow(0, running, n - running)}, 0);
            if (with_cell_state_) c = cat({c, c0.narrow(0, running, n - running)}, 0);
          }
          step(xw.narrow(0, offsets[static_cast<size_t>(t)], n), k, h, c);
          hs[static_cast<size_t>(t)] = h;
        }
      }
      outputs.push_back(cat(hs, 0));
      h_n.push_back(h);
      if (with_cell_state_) c_n.push_back(c);
    }
    layer_input = num_directions == 1 ? outputs[0] : cat(outputs, 1);
  }
  return {layer_input, stack(h_n, 0), with_cell_state_ ? stack(c_n, 0) : Tensor()};
}

// ---- the three layers --------------------------------------------------------------------------

RNN::RNN(int64_t in, int64_t hidden, RNNOptions o)
    : RNNBase("RNN", 1, false, in, hidden, without_nonlinearity(o)), nonlinearity(o.nonlinearity) {
  detail::check_nonlinearity("RNN", nonlinearity);
}

void RNN::step(const Tensor& xw, int64_t k, Tensor& h, Tensor&) const {
  const Tensor hw = hidden_product(k, h);
  h = detail::rnn_step(xw, hw, nonlinearity == "relu");
}

LSTM::LSTM(int64_t in, int64_t hidden, LSTMOptions o) : RNNBase("LSTM", 4, true, in, hidden, o) {}

void LSTM::step(const Tensor& xw, int64_t k, Tensor& h, Tensor& c) const {
  const Tensor hw = hidden_product(k, h);
  LSTMState next = detail::lstm_step(xw, hw, c);
  // h_t = W_hr (o * tanh(c_t)) with proj_size
  h = options.proj_size > 0 ? project(k, RecurrentWeight::Projection, next.h, Tensor()) : next.h;
  c = next.c;
}

GRU::GRU(int64_t in, int64_t hidden, GRUOptions o) : RNNBase("GRU", 3, false, in, hidden, o) {}

void GRU::step(const Tensor& xw, int64_t k, Tensor& h, Tensor&) const {
  const Tensor hw = hidden_product(k, h);
  h = detail::gru_step(xw, hw, h);
}

}  // namespace strata::nn
