// nn::functional: linear, embedding and the activation wrappers.
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

namespace strata::nn::functional {

// One `linear` op (src/ops/linear.cpp): x's leading dims folded into one GEMM, the transposed
// weight read in place and the bias added in the same pass (cuBLASLt's epilogue on CUDA).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) { return strata::linear(x, weight, bias); }

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  STRATA_CHECK(indices.defined() && weight.defined(), "[embedding] indices or weight is undefined");
  STRATA_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32,
               "[embedding] indices must be int64 or int32, got {}", indices.dtype());
  STRATA_CHECK(weight.dim() == 2, "[embedding] weight must be 2-d (num_embeddings, embedding_dim), got shape {}",
               weight.shape());
  STRATA_CHECK(indices.device() == weight.device(), "[embedding] indices are on {} but the weight is on {}",
               indices.device(), weight.device());
  const int64_t num = weight.size(0), dim = weight.size(1);
  std::optional<int64_t> pad;
  if (padding_idx) {
    STRATA_CHECK(*padding_idx >= -num && *padding_idx < num,
                 "[embedding] padding_idx {} is out of range for {} embeddings", *padding_idx, num);
    pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
  }
  Tensor flat = indices.reshape({-1});
  if (flat.numel() > 0) {
    NoGradGuard no_grad;
    const int64_t lo = amin(flat).item<int64_t>(), hi = amax(flat).item<int64_t>();
    STRATA_CHECK(lo >= 0 && hi < num, "[embedding] index {} is out of range for {} embeddings (indices of shape {})",
                 lo < 0 ? lo : hi, num, indices.shape());
  }
  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor rows;
  {
    NoGradGuard no_grad;
    rows = index_select(weight, 0, flat).view(shape);
  }
  // the gradient adds each output row into its embedding row (repeated indices accumulate)
  autograd::record("embedding", {weight}, {rows}, {flat}, [num, dim, pad](const autograd::Grads& g,
                                                                       const autograd::Saved& s) {
    const Tensor& idx = s[0];
    Tensor g2 = g[0].reshape({-1, dim});
    Tensor grad = zeros({num, dim}, TensorOptions(g2.dtype(), g2.device()));
    if (autograd::is_grad_enabled()) {  // create_graph: out of place, so it is recorded
      if (pad) g2 = where((idx == *pad).unsqueeze(1), 0, g2);
      return autograd::Grads{index_add(grad, 0, idx, g2)};
    }
    index_add_(grad, 0, idx, g2);
    if (pad) grad.select(0, *pad).zero_();
    return autograd::Grads{grad};
  });
  return rows;
}

Tensor relu(const Tensor& x) { return strata::relu(x); }
Tensor gelu(const Tensor& x, std::string_view approximate) { return strata::gelu(x, approximate); }
Tensor silu(const Tensor& x) { return strata::silu(x); }
Tensor tanh(const Tensor& x) { return strata::tanh(x); }
Tensor sigmoid(const Tensor& x) { return strata::sigmoid(x); }
Tensor leaky_relu(const Tensor& x, double negative_slope) { return strata::leaky_relu(x, negative_slope); }
Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) { return strata::softmax(x, dim, dtype); }
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return strata::log_softmax(x, dim, dtype);
}

}  // namespace strata::nn::functional
