// The method forms of ops declared in include/strata/ops/ (t.add(u) for add(t, u)), so code
// written against LibTorch's Tensor methods reads the same.
#include <strata/ops/binary.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

namespace strata {

Tensor Tensor::add(const Tensor& other, Scalar alpha) const {
  return alpha.to_double() == 1.0 ? strata::add(*this, other) : strata::add(*this, strata::mul(other, alpha));
}
Tensor Tensor::add(Scalar other) const { return strata::add(*this, other); }
Tensor Tensor::sub(const Tensor& other, Scalar alpha) const {
  return alpha.to_double() == 1.0 ? strata::sub(*this, other) : strata::sub(*this, strata::mul(other, alpha));
}
Tensor Tensor::sub(Scalar other) const { return strata::sub(*this, other); }
Tensor Tensor::mul(const Tensor& other) const { return strata::mul(*this, other); }
Tensor Tensor::mul(Scalar other) const { return strata::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return strata::div(*this, other); }
Tensor Tensor::div(Scalar other) const { return strata::div(*this, other); }
Tensor Tensor::square() const { return strata::square(*this); }
Tensor Tensor::masked_fill(const Tensor& mask, Scalar value) const { return strata::masked_fill(*this, mask, value); }
Tensor Tensor::softmax(int64_t dim) const { return strata::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return strata::log_softmax(*this, dim); }
Tensor Tensor::sum(int64_t dim, bool keepdim) const { return strata::sum(*this, {dim}, keepdim); }
Tensor Tensor::mean(int64_t dim, bool keepdim) const { return strata::mean(*this, {dim}, keepdim); }
Tensor Tensor::cumsum(int64_t dim) const { return strata::cumsum(*this, dim); }
Tensor Tensor::all() const { return strata::all(*this); }
Tensor Tensor::any() const { return strata::any(*this); }
Tensor Tensor::isnan() const { return strata::isnan(*this); }
Tensor Tensor::nonzero() const { return strata::nonzero(*this); }
Tensor Tensor::masked_select(const Tensor& mask) const { return strata::masked_select(*this, mask); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return strata::index_select(*this, dim, index); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return strata::gather(*this, dim, index); }
Tensor Tensor::flip(const std::vector<int64_t>& dims) const { return strata::flip(*this, dims); }
Tensor Tensor::repeat(const std::vector<int64_t>& repeats) const { return strata::repeat(*this, repeats); }
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const { return strata::chunk(*this, chunks, dim); }
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const {
  return strata::split(*this, split_size, dim);
}
std::vector<Tensor> Tensor::unbind(int64_t dim) const { return strata::unbind(*this, dim); }
const Tensor& Tensor::lerp_(const Tensor& end, Scalar weight) const {
  return copy_(strata::lerp(*this, end, weight));
}

}  // namespace strata
