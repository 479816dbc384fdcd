// cat and stack (new tensors) and split / chunk (views of one tensor). cat records its
// backward (slices of the gradient), split (and chunk) one node whose backward is a cat;
// stack is made of recorded views and cat.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "autograd/views.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/cat.h"

namespace strata {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  STRATA_CHECK(!tensors.empty(), "[cat] expects a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) STRATA_CHECK(tensors[i].defined(), "[cat] tensor {} is undefined", i);
  DType dtype = tensors[0].dtype();
  const Device device = tensors[0].device();
  // 1-d tensors of shape {0} take no part beyond type promotion, as in PyTorch
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; };
  int64_t ref = -1;  // the first tensor that takes part
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    dtype = promote_types(dtype, t.dtype());
    STRATA_CHECK(t.device() == device, "[cat] tensor {} is on {} but tensor 0 is on {}", i, t.device(), device);
    if (ref < 0 && !skipped(t)) ref = static_cast<int64_t>(i);
  }
  if (ref < 0) return detail::make_tensor({0}, dtype, device);
  const Tensor& r = tensors[ref];
  STRATA_CHECK(r.dim() > 0, "[cat] tensor {} is 0-d; 0-d tensors cannot be concatenated", ref);
  const int64_t d = normalize_dim(dim, r.dim(), "cat");
  Shape shape = r.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t)) continue;
    STRATA_CHECK(t.dim() == r.dim(), "[cat] tensor {} has {} dims (shape {}) but tensor {} has {} (shape {})", i,
                 t.dim(), t.shape(), ref, r.dim(), r.shape());
    for (int64_t k = 0; k < r.dim(); ++k)
      STRATA_CHECK(k == d || t.size(k) == r.size(k),
                   "[cat] shapes must match except in dim {}: tensor {} has shape {} but tensor {} has shape {}", d, i,
                   t.shape(), ref, r.shape());
    STRATA_CHECK(shape[d] <= INT64_MAX - t.size(d), "[cat] the concatenated size along dim {} overflows int64", d);
    shape[d] += t.size(d);
  }
  Tensor out = detail::make_tensor(shape, dtype, device);
  // on the CPU, inputs already of the output's dtype and contiguous are copied row by row
  std::vector<cpu::CatInput> rows;
  if (device.is_cpu() && out.numel() > 0) {
    int64_t outer = 1;  // rows: the dims before d
    for (int64_t k = 0; k < d; ++k) outer *= shape[k];
    for (const Tensor& t : tensors) {
      if (skipped(t) || t.size(d) == 0) continue;
      if (t.dtype() != dtype || !t.is_contiguous()) {
        rows.clear();
        break;
      }
      rows.push_back({static_cast<const char*>(t.data()), t.numel() / outer * static_cast<int64_t>(t.itemsize())});
    }
    if (!rows.empty()) {
      cpu::cat_rows(static_cast<char*>(out.data()), outer, out.numel() / outer * static_cast<int64_t>(out.itemsize()),
                    rows.data(), static_cast<int64_t>(rows.size()));
    }
  }
  if (rows.empty()) {
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      if (skipped(t) || t.size(d) == 0) continue;
      out.narrow(d, offset, t.size(d)).copy_(t);
      offset += t.size(d);
    }
  }
  if (autograd::any_requires_grad(tensors)) {
    std::vector<int64_t> sizes;  // -1: a skipped input, which gets no gradient
    for (const Tensor& t : tensors) sizes.push_back(skipped(t) ? -1 : t.size(d));
    autograd::record("cat", tensors, {out}, {}, [sizes, d](const autograd::Grads& g, const autograd::Saved&) {
      autograd::Grads grads;
      int64_t offset = 0;
      for (int64_t s : sizes) {
        grads.push_back(s < 0 ? Tensor() : g[0].narrow(d, offset, s));
        offset += std::max<int64_t>(s, 0);
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  STRATA_CHECK(!tensors.empty(), "[stack] expects a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    STRATA_CHECK(tensors[i].defined(), "[stack] tensor {} is undefined", i);
    STRATA_CHECK(tensors[i].shape() == tensors[0].shape(), "[stack] tensor {} has shape {} but tensor 0 has shape {}",
                 i, tensors[i].shape(), tensors[0].shape());
  }
  const int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(d));
  return cat(parts, d);
}

namespace {

// Views of t along dim d of the given sizes, recorded as one node whose backward is one cat of
// the parts' gradients (zeros for a part that got none): a gradient of t's size is written
// once, where a recorded view per part would give each part a zero-filled gradient of t's size
// to add up.
std::vector<Tensor> split_views(const Tensor& t, int64_t d, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (int64_t s : sizes) {
      out.push_back(t.narrow(d, start, s));
      start += s;
    }
  }
  if (autograd::any_requires_grad({&t})) {
    // the node hands its backward a defined gradient per part (zeros for unused ones)
    autograd::record("split", {t}, out, {},
                     [d](const autograd::Grads& g, const autograd::Saved&) { return autograd::Grads{cat(g, d)}; });
    if (!out.empty() && out[0].grad_fn()) out[0].grad_fn()->dims = {d};
  }
  // views of t, for an in-place op under autograd on a part (Note [Views under autograd])
  for (const Tensor& part : out) autograd::detail::track_view(t, part);
  return out;
}

}  // namespace

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  STRATA_CHECK(t.defined(), "[split] input tensor is undefined");
  STRATA_CHECK(t.dim() > 0, "[split] cannot split a 0-d tensor");
  const int64_t d = normalize_dim(dim, t.dim(), "split");
  const int64_t n = t.size(d);
  STRATA_CHECK(split_size >= 0, "[split] split_size must be non-negative, got {}", split_size);
  STRATA_CHECK(split_size > 0 || n == 0, "[split] split_size can only be 0 when dim {} has size 0, but it has size {}",
               d, n);
  const int64_t count = split_size == 0 ? 1 : std::max<int64_t>(n / split_size + (n % split_size != 0), 1);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < count; ++i) sizes.push_back(std::min(split_size, n - i * split_size));
  return split_views(t, d, sizes);
}

std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) {
  STRATA_CHECK(t.defined(), "[split] input tensor is undefined");
  STRATA_CHECK(t.dim() > 0, "[split] cannot split a 0-d tensor");
  const int64_t d = normalize_dim(dim, t.dim(), "split");
  const int64_t n = t.size(d);
  int64_t total = 0;
  for (int64_t s : sizes) {
    STRATA_CHECK(s >= 0, "[split] split sizes must be non-negative, got {}", sizes);
    STRATA_CHECK(total <= n - s, "[split] split sizes {} do not sum to the size {} of dim {}", sizes, n, d);
    total += s;
  }
  STRATA_CHECK(total == n, "[split] split sizes {} do not sum to the size {} of dim {}", sizes, n, d);
  return split_views(t, d, sizes);
}

std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) {
  return split_with_sizes(t, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  STRATA_CHECK(t.defined(), "[chunk] input tensor is undefined");
  STRATA_CHECK(chunks > 0, "[chunk] chunks must be positive, got {}", chunks);
  STRATA_CHECK(t.dim() > 0, "[chunk] cannot chunk a 0-d tensor");
  const int64_t d = normalize_dim(dim, t.dim(), "chunk");
  const int64_t n = t.size(d);
  if (n == 0) return split_with_sizes(t, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  return split(t, n / chunks + (n % chunks != 0), d);
}

}  // namespace strata
