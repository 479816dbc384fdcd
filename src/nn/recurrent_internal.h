// The one-step updates and the checks shared by the recurrent layers (nn/recurrent.cpp) and the
// cells (nn/recurrent_cells.cpp, which defines them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <strata/core/generator.hpp>
#include <strata/nn/recurrent.hpp>

namespace strata::nn::detail {

// Each step takes xw, the input through weight_ih and bias_ih (N, gates * hidden_size), and hw,
// the hidden state h through weight_hh and bias_hh (likewise): the products are the layer's
// (RNNBase::project, float or a form's), the gate math is here. Gates in PyTorch's order (see
// include/strata/nn/recurrent.hpp).

/// h' = act(xw + hw), act relu or tanh.
Tensor rnn_step(const Tensor& xw, const Tensor& hw, bool relu);
/// c' = f * c + i * g, h' = o * tanh(c') (before LSTM's projection).
LSTMState lstm_step(const Tensor& xw, const Tensor& hw, const Tensor& c);
/// h' = (1 - z) * n + z * h.
Tensor gru_step(const Tensor& xw, const Tensor& hw, const Tensor& h);

/// set_form's checks: the new form is not null and the layer has none yet.
void check_new_form(const std::string& layer, const RecurrentForm* current, const RecurrentForm* form);
/// replacing_child's: the form is not replaced by set_submodule.
void check_not_form(const std::string& layer, const Module* child, const RecurrentForm* form);

/// A packed batch's shape: sequences in sorted position s (longest first) and their order.
struct PackedLayout {
  std::vector<int64_t> batch_sizes;  // sequences still running at each step
  std::vector<int64_t> lengths;      // (B) the length of the sequence at each sorted position
  std::vector<int64_t> order;        // (B) sorted position -> index in the batch
  bool permuted = false;             // whether the PackedSequence keeps sorted_indices
  /// The first packed row of each step, and the total row count last.
  std::vector<int64_t> offsets() const;
  /// (B) index in the batch -> sorted position: PackedSequence::unsorted_indices.
  std::vector<int64_t> inverse() const;
};

/// The layout of a PackedSequence, checked (batch_sizes, its data's rows, the permutations);
/// errors name `op`.
PackedLayout packed_layout(const std::string& op, const utils::rnn::PackedSequence& p);

/// Raises Error naming `layer` unless both sizes are positive.
void check_recurrent_sizes(const std::string& layer, int64_t input_size, int64_t hidden_size);
/// Raises Error naming `layer` unless nonlinearity is "tanh" or "relu".
void check_nonlinearity(const std::string& layer, const std::string& nonlinearity);
/// U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every parameter, in order, as
/// torch.nn.RNNBase.reset_parameters and RNNCellBase.reset_parameters.
void init_recurrent_parameters(const std::vector<Tensor>& parameters, int64_t hidden_size, Generator* gen);

}  // namespace strata::nn::detail
