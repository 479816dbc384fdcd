// pixel_shuffle and pixel_unshuffle: a reshape, a permute and a reshape (one copy), as torch's,
// so both devices and the gradients come from the view ops.
#include <strata/nn/functional_resample.hpp>

namespace strata::nn::functional {

namespace {

// input's leading dims (all but the last three) followed by `tail`.
Shape with_tail(const Tensor& input, std::initializer_list<int64_t> tail) {
  Shape s(input.shape().begin(), input.shape().end() - 3);
  s.insert(s.end(), tail);
  return s;
}

// The permutation that swaps the two factor dims into place, leaving the leading dims first.
std::vector<int64_t> permutation(int64_t lead, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> p;
  for (int64_t d = 0; d < lead; ++d) p.push_back(d);
  for (int64_t d : tail) p.push_back(lead + d);
  return p;
}

}  // namespace

Tensor pixel_shuffle(const Tensor& input, int64_t r) {
  STRATA_CHECK(input.defined(), "[pixel_shuffle] input tensor is undefined");
  STRATA_CHECK(input.dim() >= 3, "[pixel_shuffle] expects an input of shape (*, C * r^2, H, W), got shape {}",
               input.shape());
  STRATA_CHECK(r > 0, "[pixel_shuffle] upscale_factor must be positive, got {}", r);
  const int64_t c = input.size(-3), h = input.size(-2), w = input.size(-1);
  STRATA_CHECK(c % (r * r) == 0, "[pixel_shuffle] {} channels are not divisible by upscale_factor^2 = {}", c, r * r);
  const int64_t lead = input.dim() - 3, oc = c / (r * r);
  // (*, oc, r, r, H, W) -> (*, oc, H, r, W, r)
  const Tensor split = input.reshape(with_tail(input, {oc, r, r, h, w}));
  return split.permute(permutation(lead, {0, 3, 1, 4, 2})).reshape(with_tail(input, {oc, h * r, w * r}));
}

Tensor pixel_unshuffle(const Tensor& input, int64_t r) {
  STRATA_CHECK(input.defined(), "[pixel_unshuffle] input tensor is undefined");
  STRATA_CHECK(input.dim() >= 3, "[pixel_unshuffle] expects an input of shape (*, C, H * r, W * r), got shape {}",
               input.shape());
  STRATA_CHECK(r > 0, "[pixel_unshuffle] downscale_factor must be positive, got {}", r);
  const int64_t c = input.size(-3), h = input.size(-2), w = input.size(-1);
  STRATA_CHECK(h % r == 0 && w % r == 0, "[pixel_unshuffle] height {} and width {} must be divisible by {}", h, w, r);
  const int64_t lead = input.dim() - 3, oh = h / r, ow = w / r;
  // (*, C, oh, r, ow, r) -> (*, C, r, r, oh, ow)
  const Tensor split = input.reshape(with_tail(input, {c, oh, r, ow, r}));
  return split.permute(permutation(lead, {0, 2, 4, 1, 3})).reshape(with_tail(input, {c * r * r, oh, ow}));
}

}  // namespace strata::nn::functional
