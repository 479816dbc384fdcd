// Variable-length sequences for the recurrent layers, as torch.nn.utils.rnn: a batch of
// sequences of different lengths packed time step by time step (PackedSequence), the functions
// that pack and unpack it, and pad_sequence. RNN, LSTM and GRU take a PackedSequence and skip
// the padding: each sequence's final state is the one at its own length.
//
//   namespace R = strata::nn::utils::rnn;
//   auto packed = R::pack_padded_sequence(x, {5, 2, 3}, /*batch_first=*/false, /*enforce_sorted=*/false);
//   auto [out, h_n, c_n] = lstm.forward_with_state(packed);
//   auto [padded, lengths] = R::pad_packed_sequence(out);  // padded (5, 3, hidden_size)
//
// Every function is composed of differentiable ops (index_select, narrow, cat), so gradients
// flow from the packed data back to the padded input and the other way.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata::nn::utils::rnn {

/// B sequences packed time step by time step, longest first: the rows of step t are the steps t
/// of the batch_sizes[t] sequences longer than t, in decreasing order of length.
struct PackedSequence {
  Tensor data;              // (sum of the lengths, *)
  Tensor batch_sizes;       // (max length) int64 on the CPU, non-increasing
  Tensor sorted_indices;    // (B) int64: sorted position -> the sequence's index in the batch; undefined if
                            // the batch came sorted
  Tensor unsorted_indices;  // (B) int64: the inverse permutation (taken as such when left undefined)
};

/// pad_packed_sequence's result.
struct PaddedSequence {
  Tensor padded;   // (T, B, *), or (B, T, *) with batch_first, in the batch's own order
  Tensor lengths;  // (B) int64 on the CPU, in the batch's own order
};

/// Packs input (T, B, *), or (B, T, *) with batch_first, whose sequence b has lengths[b] steps
/// (each in [1, T]). With enforce_sorted the lengths must be non-increasing (sorted_indices is
/// then undefined); without, the batch is sorted by decreasing length (stably) and the
/// permutation kept. lengths: integer values on the CPU.
STRATA_API PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                               bool batch_first = false, bool enforce_sorted = true);
STRATA_API PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first = false,
                                               bool enforce_sorted = true);

/// The inverse of pack_padded_sequence: positions past a sequence's length hold padding_value;
/// total_length (at least the longest length) pads the time dim further, as PyTorch's.
STRATA_API PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first = false,
                                              double padding_value = 0,
                                              std::optional<int64_t> total_length = std::nullopt);

/// Stacks sequences of shapes (L_i, *) into (max L_i, B, *), or (B, max L_i, *) with batch_first,
/// padding with padding_value.
STRATA_API Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                               double padding_value = 0);
/// The sequences (L_i, *) of padded (T, B, *) (or (B, T, *)) cut to their lengths.
STRATA_API std::vector<Tensor> unpad_sequence(const Tensor& padded, const std::vector<int64_t>& lengths,
                                              bool batch_first = false);

/// Packs sequences of shapes (L_i, *) without padding them first; enforce_sorted as
/// pack_padded_sequence.
STRATA_API PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted = true);
/// The sequences (L_i, *) of a PackedSequence, in the batch's own order.
STRATA_API std::vector<Tensor> unpack_sequence(const PackedSequence& sequence);

}  // namespace strata::nn::utils::rnn
