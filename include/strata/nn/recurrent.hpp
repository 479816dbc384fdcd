// Recurrent layers as in torch.nn: RNN (Elman, tanh or relu), LSTM and GRU over whole sequences,
// and the one-step RNNCell, LSTMCell and GRUCell. Parameter names, shapes, registration order,
// gate order and initialization match PyTorch's, so a PyTorch state_dict loads. They are composed
// of tensor ops (linear, sigmoid, tanh, ...), so they run on every device and differentiate like
// any other graph. LSTM takes PyTorch's proj_size (h projected through weight_hr_l{k}), and the
// layers take packed variable-length batches (nn/rnn_utils.hpp), as torch.nn.utils.rnn.
//
//   nn::LSTM lstm(10, 20, {.num_layers = 2, .bidirectional = true});
//   auto [output, h_n, c_n] = lstm.forward_with_state(x);  // x (L, N, 10): output (L, N, 40), h_n (4, N, 20)
//   auto packed = lstm.forward_with_state(utils::rnn::pack_padded_sequence(x, lengths, false, false));
//
// The gates are stacked along the rows of each weight and bias, hidden_size rows apiece: LSTM
// (i, f, g, o), GRU (r, z, n), with GRU's n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>
#include <strata/nn/rnn_utils.hpp>

namespace strata::nn {

struct RNNOptions {
  int64_t num_layers = 1;
  std::string nonlinearity = "tanh";  // "tanh" or "relu"
  bool bias = true;                   // bias_ih and bias_hh
  bool batch_first = false;           // input and output (N, L, *) rather than (L, N, *); the states keep N second
  double dropout = 0;                 // on the output of every layer but the last, in training; in [0, 1)
  bool bidirectional = false;
  Generator* generator = nullptr;  // initial values and dropout masks; default_generator() when null
};

/// LSTM's and GRU's options: RNN's without the nonlinearity.
struct RecurrentOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0;
  bool bidirectional = false;
  Generator* generator = nullptr;
  int64_t proj_size = 0;  // LSTM only: h (and the output) projected to proj_size < hidden_size features
};
using LSTMOptions = RecurrentOptions;
using GRUOptions = RecurrentOptions;

/// The weights a recurrent layer multiplies by: weight_ih, weight_hh and LSTM's weight_hr.
enum class RecurrentWeight { InputHidden, HiddenHidden, Projection };

/// Note [Recurrent forms]: as a Linear hands its product to a LinearForm (Note [Linear forms] in
/// nn/layer_form.hpp), a recurrent layer or cell hands every product by its weights to an optional
/// form, a child module holding those weights in another representation (quant::quantize_dynamic's
/// int8 or float16 ones); the gate math, the loop over steps, layers and directions, the packed
/// batches and the checks stay the layer's. Setting a form drops the layer's float weights (their
/// memory is released and they leave the state dict); the biases stay the layer's.
class STRATA_API RecurrentForm : public Module {
 public:
  /// x (rows, features) . W^T + bias for the weight `which` of layer and direction k (a layer's
  /// index into all_weights; 0 for a cell); bias undefined: none.
  virtual Tensor project(int64_t k, RecurrentWeight which, const Tensor& x, const Tensor& bias) = 0;
  /// Raises when an input or state would need a gradient through the form (undefined ones skipped).
  virtual void check_inputs(const std::string& layer, const std::vector<Tensor>& inputs) const = 0;
};

/// The parameters of one layer in one direction (gates = 1 for RNN, 4 for LSTM, 3 for GRU).
struct RecurrentWeights {
  Tensor weight_ih;  // (gates * hidden_size, the layer's input features)
  Tensor weight_hh;  // (gates * hidden_size, H), H = proj_size if set, else hidden_size
  Tensor bias_ih;    // (gates * hidden_size), undefined without bias
  Tensor bias_hh;    // (gates * hidden_size), undefined without bias
  Tensor weight_hr;  // (proj_size, hidden_size), LSTM with proj_size only
};

/// RNNBase::forward_with_state's result. With S = num_layers * num_directions and H = proj_size
/// if set, else hidden_size:
struct RNNOutput {
  Tensor output;  // (L, N, num_directions * H): the last layer's h at every step
  Tensor h_n;     // (S, N, H): each layer's and direction's final h; (S, H) unbatched
  Tensor c_n;     // LSTM's final cell states (S, N, hidden_size); undefined for RNN and GRU
};

/// forward_with_state's result for a packed batch: the states are those of each sequence at its
/// own length, in the batch's own order.
struct PackedRNNOutput {
  utils::rnn::PackedSequence output;  // data (sum of lengths, num_directions * H), the input's batch_sizes
  Tensor h_n;                         // (S, B, H)
  Tensor c_n;                         // (S, B, hidden_size), LSTM only
};

/// What RNN, LSTM and GRU share: the parameters of every layer and direction, and the loop over
/// layers, directions and time steps.
class STRATA_API RNNBase : public Module {
 public:
  /// input (L, N, input_size), (N, L, input_size) with batch_first, or unbatched (L, input_size);
  /// the initial states h0 (and c0 for LSTM) of shape (S, N, hidden_size), or (S, hidden_size) for
  /// an unbatched input, default zeros; LSTM takes both or neither. output is (N, L, *) with
  /// batch_first and (L, *) unbatched. Raises Error naming the layer for any other shape.
  RNNOutput forward_with_state(const Tensor& input, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
  /// A packed batch of B sequences (data (sum of lengths, input_size)); h0 and c0 (S, B, *) in the
  /// batch's own order (not the sorted one), as PyTorch's. batch_first does not apply.
  PackedRNNOutput forward_with_state(const utils::rnn::PackedSequence& input, const Tensor& h0 = Tensor(),
                                     const Tensor& c0 = Tensor());
  /// forward_with_state(input).output.
  Tensor forward(const Tensor& input) override;
  utils::rnn::PackedSequence forward(const utils::rnn::PackedSequence& input);
  /// forward_with_state with the hooks around it (torch's lstm(x, (h0, c0))): their inputs are
  /// {input, h0, c0} (a packed batch's data for a PackedSequence), their outputs {output, h_n,
  /// c_n} (undefined where absent). lstm(x) is the one-input call, returning the output alone.
  RNNOutput operator()(const Tensor& input, const Tensor& h0, const Tensor& c0 = Tensor());
  PackedRNNOutput operator()(const utils::rnn::PackedSequence& input, const Tensor& h0 = Tensor(),
                             const Tensor& c0 = Tensor());
  using Module::operator();
  /// Re-draws every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch.
  void reset_parameters(Generator* gen = nullptr);
  /// Hands the products by the weights to `form`, registered as the child `name`, and drops the
  /// float weights (Note [Recurrent forms]); raises when the layer has a form already.
  RecurrentForm& set_form(std::string name, std::unique_ptr<RecurrentForm> form);
  RecurrentForm* form() const { return form_; }
  /// The parameter name of layer and direction k's weight `which` ("weight_hh_l1_reverse").
  std::string weight_name(int64_t k, RecurrentWeight which) const;
  /// "LSTM(10, 20, num_layers=2)", as PyTorch prints the layer, from its sizes now (a pruned
  /// layer's are smaller).
  std::string description() const;

  int64_t input_size, hidden_size;
  int64_t num_directions;  // 2 when bidirectional, else 1
  int64_t state_size;      // the features of h: options.proj_size if set, else hidden_size
  RecurrentOptions options;
  /// Layer k's parameters: its forward direction at k * num_directions, its reverse one after it.
  std::vector<RecurrentWeights> all_weights;

 protected:
  /// Registers the parameters of `gates` gates per layer and direction; `layer` names the class
  /// in errors; with_cell_state for LSTM's c.
  RNNBase(const std::string& layer, int64_t gates, bool with_cell_state, int64_t input_size, int64_t hidden_size,
          RecurrentOptions options);
  /// One time step of layer and direction k: updates h (N, H), and c for LSTM, given xw, the
  /// step's input through weight_ih and bias_ih (N, gates * hidden_size).
  virtual void step(const Tensor& xw, int64_t k, Tensor& h, Tensor& c) const = 0;
  /// x . W^T + bias for layer and direction k's weight `which`: the float weight, or the form's.
  Tensor project(int64_t k, RecurrentWeight which, const Tensor& x, const Tensor& bias) const;
  /// h . W_hh^T + b_hh of layer and direction k (N, gates * hidden_size).
  Tensor hidden_product(int64_t k, const Tensor& h) const;
  void replacing_child(Module* old, Module* now) override;

 private:
  struct LayersOutput {
    Tensor data, h_n, c_n;
  };
  /// Every layer and direction over packed rows x (rows, input_size) laid out by batch_sizes (a
  /// padded batch is the layout with equal sizes), from states (S, B, *) in sorted order.
  LayersOutput run_layers(const Tensor& x, const std::vector<int64_t>& batch_sizes, const Tensor& h_init,
                          const Tensor& c_init);
  /// h0 or c0 (`what`, of `features`) as (S, batch, features): zeros when not given; errors name
  /// the input's shape.
  Tensor initial_state(const char* what, const Tensor& given, const Tensor& input, bool unbatched, int64_t batch,
                       int64_t features) const;
  void check_states_given(const Tensor& h0, const Tensor& c0) const;

  std::string layer_;  // "LSTM", "GRU" or "RNN", for description()
  bool with_cell_state_;
  RecurrentForm* form_ = nullptr;  // owned as a child
};

/// h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (or relu).
class STRATA_API RNN : public RNNBase {
 public:
  RNN(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  std::string name() const override { return "RNN"; }

  std::string nonlinearity;

 protected:
  void step(const Tensor& xw, int64_t k, Tensor& h, Tensor& c) const override;
};

class STRATA_API LSTM : public RNNBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, LSTMOptions options = {});
  std::string name() const override { return "LSTM"; }

 protected:
  void step(const Tensor& xw, int64_t k, Tensor& h, Tensor& c) const override;
};

class STRATA_API GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, GRUOptions options = {});
  std::string name() const override { return "GRU"; }

 protected:
  void step(const Tensor& xw, int64_t k, Tensor& h, Tensor& c) const override;
};

// ---- cells: one time step ----------------------------------------------------------------------

struct RNNCellOptions {
  bool bias = true;
  std::string nonlinearity = "tanh";  // "tanh" or "relu"
  Generator* generator = nullptr;     // initial values; default_generator() when null
};

/// LSTMCell's and GRUCell's options: RNNCell's without the nonlinearity.
struct RecurrentCellOptions {
  bool bias = true;
  Generator* generator = nullptr;
};
using LSTMCellOptions = RecurrentCellOptions;
using GRUCellOptions = RecurrentCellOptions;

/// LSTMCell's result: the next hidden and cell states.
struct LSTMState {
  Tensor h;
  Tensor c;
};

/// What the cells share: the parameters, under PyTorch's names, and their initialization.
class STRATA_API RNNCellBase : public Module {
 public:
  /// Re-draws every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch.
  void reset_parameters(Generator* gen = nullptr);
  /// As RNNBase::set_form, with k = 0 (Note [Recurrent forms]).
  RecurrentForm& set_form(std::string name, std::unique_ptr<RecurrentForm> form);
  RecurrentForm* form() const { return form_; }
  /// x . W^T + bias for the weight `which` (not Projection): the float weight, or the form's.
  Tensor project(RecurrentWeight which, const Tensor& x, const Tensor& bias) const;

  int64_t input_size, hidden_size;
  Tensor weight_ih;  // (gates * hidden_size, input_size); undefined once a form replaced it
  Tensor weight_hh;  // (gates * hidden_size, hidden_size); likewise
  Tensor bias_ih;    // (gates * hidden_size), undefined without bias
  Tensor bias_hh;    // (gates * hidden_size), undefined without bias

 protected:
  RNNCellBase(const std::string& layer, int64_t gates, int64_t input_size, int64_t hidden_size, bool bias,
              Generator* gen);
  void replacing_child(Module* old, Module* now) override;

 private:
  RecurrentForm* form_ = nullptr;  // owned as a child
};

/// input (N, input_size) or unbatched (input_size); the states (N, hidden_size) or
/// (hidden_size) to match, default zeros. Raises Error naming the cell for any other shape.
class STRATA_API RNNCell : public RNNCellBase {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options = {});
  /// The next hidden state.
  Tensor forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  /// forward(input, hx) with the hooks around it: their inputs are {input, hx}.
  Tensor operator()(const Tensor& input, const Tensor& hx);
  using Module::operator();
  std::string name() const override { return "RNNCell"; }

  std::string nonlinearity;
};

class STRATA_API LSTMCell : public RNNCellBase {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, LSTMCellOptions options = {});
  /// The next hidden and cell states; hx and cx are given together or not at all.
  LSTMState forward_with_state(const Tensor& input, const Tensor& hx = Tensor(), const Tensor& cx = Tensor());
  /// forward_with_state(input).h.
  Tensor forward(const Tensor& input) override { return forward_with_state(input).h; }
  /// forward_with_state with the hooks around it: their inputs are {input, hx, cx}, their
  /// outputs {h, c}.
  LSTMState operator()(const Tensor& input, const Tensor& hx, const Tensor& cx);
  using Module::operator();
  std::string name() const override { return "LSTMCell"; }
};

class STRATA_API GRUCell : public RNNCellBase {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, GRUCellOptions options = {});
  /// The next hidden state.
  Tensor forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  /// forward(input, hx) with the hooks around it: their inputs are {input, hx}.
  Tensor operator()(const Tensor& input, const Tensor& hx);
  using Module::operator();
  std::string name() const override { return "GRUCell"; }
};

}  // namespace strata::nn
