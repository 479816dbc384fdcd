// F::pad. Constant padding copies the input into a tensor filled with the value (autograd
// records the copy into a slice, so the gradient is the matching slice of the output's); the
// other modes gather each padded dim with index_select through an index that reflects,
// clamps or wraps, so both devices run them and index_select's backward sums the gradient of
// repeated elements.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <strata/nn/functional_resample.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>

#include "nn/spatial_view.h"

namespace strata::nn::functional {

namespace {

const char* mode_name(PadMode m) {
  switch (m) {
    case PadMode::Constant: return "constant";
    case PadMode::Reflect: return "reflect";
    case PadMode::Replicate: return "replicate";
    case PadMode::Circular: return "circular";
  }
  return "?";
}

// Where output position j of a dim of `size` padded by `left` reads from.
int64_t source_index(PadMode mode, int64_t j, int64_t left, int64_t size) {
  int64_t i = j - left;
  switch (mode) {
    case PadMode::Reflect:
      if (i < 0) i = -i;
      if (i >= size) i = 2 * (size - 1) - i;
      return i;
    case PadMode::Replicate: return std::clamp<int64_t>(i, 0, size - 1);
    default: return ((i % size) + size) % size;
  }
}

Tensor pad_constant(const detail::SpatialView& v, const std::vector<int64_t>& padding, double value) {
  const Tensor& x = v.tensor;
  const int64_t rank = x.dim();
  Shape out_shape = x.shape();
  Tensor src = x;
  std::vector<int64_t> starts(static_cast<size_t>(rank), 0);
  for (size_t k = 0; k < padding.size() / 2; ++k) {
    const int64_t d = v.physical(v.rank - 1 - static_cast<int64_t>(k));
    const int64_t left = padding[2 * k], right = padding[2 * k + 1];
    out_shape[static_cast<size_t>(d)] += left + right;
    // negative pads crop the input; positive ones place it further in
    const int64_t crop_left = std::max<int64_t>(-left, 0), crop_right = std::max<int64_t>(-right, 0);
    src = src.narrow(d, crop_left, src.size(d) - crop_left - crop_right);
    starts[static_cast<size_t>(d)] = std::max<int64_t>(left, 0);
  }
  Tensor out = full(out_shape, value, TensorOptions(x.dtype(), x.device()));
  Tensor window = out;
  for (int64_t d = 0; d < rank; ++d) window = window.narrow(d, starts[static_cast<size_t>(d)], src.size(d));
  window.copy_(src);
  return out;
}

Tensor pad_gather(const detail::SpatialView& v, const std::vector<int64_t>& padding, PadMode mode) {
  Tensor out = v.tensor;
  for (size_t k = 0; k < padding.size() / 2; ++k) {
    const int64_t d = v.physical(v.rank - 1 - static_cast<int64_t>(k));
    const int64_t left = padding[2 * k], right = padding[2 * k + 1], size = out.size(d);
    if (left == 0 && right == 0) continue;
    std::vector<int64_t> index(static_cast<size_t>(size + left + right));
    for (size_t j = 0; j < index.size(); ++j) index[j] = source_index(mode, static_cast<int64_t>(j), left, size);
    out = index_select(out, d, from_vector(index).to(out.device()));
  }
  return out;
}

}  // namespace

Tensor pad(const Tensor& input, const std::vector<int64_t>& padding, PadMode mode, double value) {
  STRATA_CHECK(input.defined(), "[pad] input tensor is undefined");
  const int64_t padded = static_cast<int64_t>(padding.size() / 2);
  STRATA_CHECK(padding.size() % 2 == 0 && padded <= input.dim(),
               "[pad] padding has {} entries; it needs two (left, right) per padded dim, for at most the "
               "input's {} dims (input of shape {})",
               padding.size(), input.dim(), input.shape());
  STRATA_CHECK(mode == PadMode::Constant || value == 0,
               "[pad] a fill value ({}) is only used by constant padding, not {}", value, mode_name(mode));
  STRATA_CHECK(mode == PadMode::Constant || is_floating(input.dtype()),
               "[pad] {} padding takes floating tensors, got {}", mode_name(mode), dtype_name(input.dtype()));
  for (int64_t k = 0; k < padded; ++k) {
    const int64_t d = input.dim() - 1 - k, size = input.size(d);
    const int64_t left = padding[static_cast<size_t>(2 * k)], right = padding[static_cast<size_t>(2 * k + 1)];
    const int64_t out = size + left + right;
    STRATA_CHECK(out >= (mode == PadMode::Constant ? 0 : 1),
                 "[pad] padding ({}, {}) of dim {} (size {}) leaves a size of {}", left, right, d, size, out);
    STRATA_CHECK(std::max<int64_t>(-left, 0) + std::max<int64_t>(-right, 0) <= size,
                 "[pad] padding ({}, {}) of dim {} crops more than its size {}", left, right, d, size);
    if (mode == PadMode::Constant) continue;
    STRATA_CHECK(size > 0, "[pad] {} padding of dim {} needs a non-empty dim (input of shape {})", mode_name(mode),
                 d, input.shape());
    const int64_t limit = mode == PadMode::Reflect ? size - 1 : mode == PadMode::Circular ? size : INT64_MAX;
    STRATA_CHECK(left <= limit && right <= limit,
                 "[pad] {} padding ({}, {}) of dim {} must be at most {} for its size {}", mode_name(mode), left,
                 right, d, limit, size);
  }
  const detail::SpatialView v(input);
  Tensor out = mode == PadMode::Constant ? pad_constant(v, padding, value) : pad_gather(v, padding, mode);
  return v.restore(out);
}

}  // namespace strata::nn::functional
