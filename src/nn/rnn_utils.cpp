// torch.nn.utils.rnn: packing and padding variable-length sequences. Each conversion is one
// index_select of the source rows (a padded batch flattened to (T * B, *), or the sequences
// concatenated, with one row of padding_value appended where padding is wanted), so it runs on
// every device and its gradient is index_select's.
#include <algorithm>
#include <numeric>

#include <strata/nn/rnn_utils.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "nn/recurrent_internal.h"

namespace strata::nn {

namespace R = utils::rnn;

namespace detail {

std::vector<int64_t> PackedLayout::offsets() const {
  std::vector<int64_t> out(batch_sizes.size() + 1, 0);
  std::partial_sum(batch_sizes.begin(), batch_sizes.end(), out.begin() + 1);
  return out;
}

std::vector<int64_t> PackedLayout::inverse() const {
  std::vector<int64_t> out(order.size());
  for (size_t s = 0; s < order.size(); ++s) out[static_cast<size_t>(order[s])] = static_cast<int64_t>(s);
  return out;
}

PackedLayout packed_layout(const std::string& op, const R::PackedSequence& p) {
  STRATA_CHECK(p.data.defined() && p.batch_sizes.defined(), "[{}] the PackedSequence has no data or batch_sizes", op);
  STRATA_CHECK(p.data.dim() >= 1, "[{}] the packed data must have at least one dim, got shape {}", op, p.data.shape());
  const Tensor& bs = p.batch_sizes;
  STRATA_CHECK(bs.dim() == 1 && bs.numel() > 0 && bs.dtype() == kInt64 && bs.device().is_cpu(),
               "[{}] batch_sizes must be a non-empty 1-d int64 tensor on the CPU, got {} {} on {}", op, bs.shape(),
               bs.dtype(), bs.device());
  PackedLayout l;
  const Tensor dense = bs.contiguous();
  l.batch_sizes.assign(dense.data_ptr<int64_t>(), dense.data_ptr<int64_t>() + dense.numel());
  int64_t total = 0;
  for (size_t t = 0; t < l.batch_sizes.size(); ++t) {
    const int64_t n = l.batch_sizes[t];
    STRATA_CHECK(n > 0 && (t == 0 || n <= l.batch_sizes[t - 1]),
                 "[{}] batch_sizes must be positive and non-increasing, got {}", op, l.batch_sizes);
    total += n;
  }
  STRATA_CHECK(total == p.data.size(0), "[{}] batch_sizes sum to {} but the packed data has {} rows (shape {})", op,
               total, p.data.size(0), p.data.shape());
  const int64_t batch = l.batch_sizes[0];
  for (int64_t s = 0; s < batch; ++s)  // sequence s (sorted) is as long as the steps that count it
    l.lengths.push_back(std::count_if(l.batch_sizes.begin(), l.batch_sizes.end(), [s](int64_t n) { return n > s; }));
  l.order.resize(static_cast<size_t>(batch));
  std::iota(l.order.begin(), l.order.end(), 0);
  // as torch's PackedSequence, unsorted_indices may be left out: it is sorted_indices' inverse
  STRATA_CHECK(p.sorted_indices.defined() || !p.unsorted_indices.defined(),
               "[{}] unsorted_indices is given without sorted_indices", op);
  if (p.sorted_indices.defined()) {
    const Tensor sorted = p.sorted_indices.to(Device::cpu(), kInt64).contiguous();
    STRATA_CHECK(sorted.dim() == 1 && sorted.numel() == batch,
                 "[{}] sorted_indices ({}) must have batch_sizes[0] = {} entries", op, p.sorted_indices.shape(), batch);
    l.order.assign(sorted.data_ptr<int64_t>(), sorted.data_ptr<int64_t>() + batch);
    std::vector<bool> seen(static_cast<size_t>(batch), false);
    for (int64_t b : l.order) {
      STRATA_CHECK(b >= 0 && b < batch && !seen[static_cast<size_t>(b)],
                   "[{}] sorted_indices must be a permutation of 0..{}, got {}", op, batch - 1, l.order);
      seen[static_cast<size_t>(b)] = true;
    }
    l.permuted = true;
  }
  if (p.unsorted_indices.defined()) {
    const Tensor u = p.unsorted_indices.to(Device::cpu(), kInt64).contiguous();
    const std::vector<int64_t> given(u.data_ptr<int64_t>(), u.data_ptr<int64_t>() + u.numel()), want = l.inverse();
    STRATA_CHECK(u.dim() == 1 && given == want,
                 "[{}] unsorted_indices must be the inverse of sorted_indices {}, that is {}; got {}", op, l.order,
                 want, given);
  }
  return l;
}

}  // namespace detail

namespace utils::rnn {

namespace {

using detail::PackedLayout;

// The layout of a batch whose sequence b has lengths[b] steps (each in [1, max_steps]).
PackedLayout layout_of(const char* op, const std::vector<int64_t>& lengths, int64_t max_steps, bool enforce_sorted) {
  STRATA_CHECK(!lengths.empty(), "[{}] expects at least one sequence", op);
  for (int64_t n : lengths)
    STRATA_CHECK(n > 0 && n <= max_steps, "[{}] every length must be in [1, {}] (the steps of the input), got {}", op,
                 max_steps, lengths);
  const bool sorted = std::is_sorted(lengths.begin(), lengths.end(), std::greater<>());
  STRATA_CHECK(sorted || !enforce_sorted,
               "[{}] lengths {} are not sorted in decreasing order: sort the batch or pass enforce_sorted = false", op,
               lengths);
  PackedLayout l;
  l.order.resize(lengths.size());
  std::iota(l.order.begin(), l.order.end(), 0);
  std::stable_sort(l.order.begin(), l.order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  for (int64_t b : l.order) l.lengths.push_back(lengths[static_cast<size_t>(b)]);
  for (int64_t t = 0; t < l.lengths[0]; ++t)
    l.batch_sizes.push_back(std::count_if(l.lengths.begin(), l.lengths.end(), [t](int64_t n) { return n > t; }));
  l.permuted = !enforce_sorted;  // PyTorch keeps the (identity) permutation whenever it may sort
  return l;
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) { return from_vector(v).to(device); }

// The packed rows: row_of(t, b) is the source row of step t of sequence b (batch order).
template <class RowOf>
PackedSequence gather_packed(const Tensor& source, const PackedLayout& l, RowOf row_of) {
  std::vector<int64_t> rows;
  for (size_t t = 0; t < l.batch_sizes.size(); ++t)
    for (int64_t s = 0; s < l.batch_sizes[t]; ++s) rows.push_back(row_of(static_cast<int64_t>(t), l.order[s]));
  PackedSequence p{source.index_select(0, index_tensor(rows, source.device())), from_vector(l.batch_sizes), {}, {}};
  if (l.permuted) {
    p.sorted_indices = index_tensor(l.order, source.device());
    p.unsorted_indices = index_tensor(l.inverse(), source.device());
  }
  return p;
}

// (T, B, *) or (B, T, *) from the rows of source, whose last row is the padding: row_of(t, b) is
// the row of step t of sequence b, or -1 past its end.
template <class RowOf>
Tensor gather_padded(const Tensor& source, int64_t steps, int64_t batch, bool batch_first, RowOf row_of) {
  const int64_t pad_row = source.size(0) - 1;
  std::vector<int64_t> rows(static_cast<size_t>(steps * batch));
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t r = row_of(t, b);
      rows[static_cast<size_t>(batch_first ? b * steps + t : t * batch + b)] = r < 0 ? pad_row : r;
    }
  Shape shape = source.shape();
  shape[0] = batch_first ? steps : batch;
  shape.insert(shape.begin(), batch_first ? batch : steps);
  return source.index_select(0, index_tensor(rows, source.device())).reshape(shape);
}

Tensor with_padding_row(const std::vector<Tensor>& parts, double padding_value) {
  Shape row = parts[0].shape();
  row[0] = 1;
  std::vector<Tensor> all = parts;
  all.push_back(full(row, padding_value, parts[0].options()));
  return cat(all, 0);
}

// Checks that the sequences share their trailing dims, dtype and device; returns their lengths.
std::vector<int64_t> sequence_lengths(const char* op, const std::vector<Tensor>& sequences) {
  STRATA_CHECK(!sequences.empty(), "[{}] expects at least one sequence", op);
  std::vector<int64_t> lengths;
  const Tensor& first = sequences[0];
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    STRATA_CHECK(s.defined() && s.dim() >= 1, "[{}] sequence {} must be a tensor of shape (L, *)", op, i);
    const bool same = s.dim() == first.dim() && std::equal(s.shape().begin() + 1, s.shape().end(),
                                                           first.shape().begin() + 1);
    STRATA_CHECK(same && s.dtype() == first.dtype() && s.device() == first.device(),
                 "[{}] sequence {} ({} {} on {}) does not match sequence 0 ({} {} on {}) past the first dim", op, i,
                 s.shape(), s.dtype(), s.device(), first.shape(), first.dtype(), first.device());
    lengths.push_back(s.size(0));
  }
  return lengths;
}

std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> starts(lengths.size(), 0);
  std::partial_sum(lengths.begin(), lengths.end() - 1, starts.begin() + 1);
  return starts;
}

}  // namespace

PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths, bool batch_first,
                                    bool enforce_sorted) {
  const char* op = "pack_padded_sequence";
  STRATA_CHECK(input.defined() && input.dim() >= 2, "[{}] expects an input of shape ({}, *), got {}", op,
               batch_first ? "B, T" : "T, B", input.defined() ? input.shape() : Shape{});
  const int64_t steps = input.size(batch_first ? 1 : 0), batch = input.size(batch_first ? 0 : 1);
  STRATA_CHECK(static_cast<int64_t>(lengths.size()) == batch,
               "[{}] got {} lengths for a batch of {} sequences (input of shape {}, batch_first = {})", op,
               lengths.size(), batch, input.shape(), batch_first);
  const PackedLayout l = layout_of(op, lengths, steps, enforce_sorted);
  return gather_packed(input.flatten(0, 1), l, [&](int64_t t, int64_t b) {
    return batch_first ? b * steps + t : t * batch + b;
  });
}

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  STRATA_CHECK(lengths.defined() && lengths.dim() == 1 && is_integral(lengths.dtype()),
               "[pack_padded_sequence] lengths must be a 1-d integer tensor, got {}",
               lengths.defined() ? fmt::format("{} {}", lengths.shape(), lengths.dtype()) : "undefined");
  const Tensor v = lengths.to(Device::cpu(), kInt64).contiguous();
  return pack_padded_sequence(input, std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel()),
                              batch_first, enforce_sorted);
}

PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first, double padding_value,
                                   std::optional<int64_t> total_length) {
  const PackedLayout l = detail::packed_layout("pad_packed_sequence", sequence);
  const auto longest = static_cast<int64_t>(l.batch_sizes.size()), batch = l.batch_sizes[0];
  const int64_t steps = total_length.value_or(longest);
  STRATA_CHECK(steps >= longest, "[pad_packed_sequence] total_length {} is below the longest sequence ({} steps)",
               steps, longest);
  const std::vector<int64_t> offsets = l.offsets();
  const std::vector<int64_t> sorted_position = l.inverse();
  std::vector<int64_t> lengths(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s) lengths[static_cast<size_t>(l.order[s])] = l.lengths[s];
  const Tensor padded = gather_padded(with_padding_row({sequence.data}, padding_value), steps, batch, batch_first,
                                      [&](int64_t t, int64_t b) {
                                        const int64_t s = sorted_position[static_cast<size_t>(b)];
                                        return t < l.lengths[s] ? offsets[t] + s : -1;
                                      });
  return {padded, from_vector(lengths)};
}

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first, double padding_value) {
  const std::vector<int64_t> lengths = sequence_lengths("pad_sequence", sequences);
  const std::vector<int64_t> starts = starts_of(lengths);
  const int64_t steps = *std::max_element(lengths.begin(), lengths.end());
  return gather_padded(with_padding_row(sequences, padding_value), steps, static_cast<int64_t>(sequences.size()),
                       batch_first, [&](int64_t t, int64_t b) {
                         return t < lengths[static_cast<size_t>(b)] ? starts[static_cast<size_t>(b)] + t : -1;
                       });
}

std::vector<Tensor> unpad_sequence(const Tensor& padded, const std::vector<int64_t>& lengths, bool batch_first) {
  STRATA_CHECK(padded.defined() && padded.dim() >= 2, "[unpad_sequence] expects a padded batch of shape ({}, *)",
               batch_first ? "B, T" : "T, B");
  const int64_t steps = padded.size(batch_first ? 1 : 0), batch = padded.size(batch_first ? 0 : 1);
  STRATA_CHECK(static_cast<int64_t>(lengths.size()) == batch,
               "[unpad_sequence] got {} lengths for a batch of {} sequences (shape {})", lengths.size(), batch,
               padded.shape());
  std::vector<Tensor> out;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = lengths[static_cast<size_t>(b)];
    STRATA_CHECK(n >= 0 && n <= steps, "[unpad_sequence] length {} of sequence {} is not in [0, {}]", n, b, steps);
    out.push_back(padded.select(batch_first ? 0 : 1, b).narrow(0, 0, n));
  }
  return out;
}

PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted) {
  const std::vector<int64_t> lengths = sequence_lengths("pack_sequence", sequences);
  const std::vector<int64_t> starts = starts_of(lengths);
  const PackedLayout l = layout_of("pack_sequence", lengths, *std::max_element(lengths.begin(), lengths.end()),
                                   enforce_sorted);
  return gather_packed(cat(sequences, 0), l, [&](int64_t t, int64_t b) { return starts[static_cast<size_t>(b)] + t; });
}

std::vector<Tensor> unpack_sequence(const PackedSequence& sequence) {
  const PackedLayout l = detail::packed_layout("unpack_sequence", sequence);
  const std::vector<int64_t> offsets = l.offsets();
  std::vector<Tensor> out(l.order.size());
  for (size_t s = 0; s < l.order.size(); ++s) {
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < l.lengths[s]; ++t) rows.push_back(offsets[t] + static_cast<int64_t>(s));
    out[static_cast<size_t>(l.order[s])] = sequence.data.index_select(0, index_tensor(rows, sequence.data.device()));
  }
  return out;
}

}  // namespace utils::rnn

}  // namespace strata::nn
