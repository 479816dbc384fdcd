// Matrix products with PyTorch's semantics: matmul (1-d, 2-d and batched N-d with
// broadcast batch dims), mm (2-d only), bmm (3-d, equal batches), einsum, and linear (x W^T + b,
// the op behind nn::functional::linear, with the bias, and optionally GELU, fused into the
// GEMM where the device can).
#pragma once

#include <string_view>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata {

/// The product of a and b, by their dims:
///   (k) x (k) -> ()            dot product, a 0-d tensor
///   (m, k) x (k) -> (m)        matrix-vector
///   (k) x (k, n) -> (n)        vector-matrix
///   (m, k) x (k, n) -> (m, n)
///   (..., m, k) x (..., k, n) -> (..., m, n)   batch dims broadcast; a 1-d operand gets a
///                                              dim of 1 added (then removed from the result)
/// Dtypes promote as in binary ops; bool is not supported. Transposed and other views
/// whose rows or columns are unit-stride are read in place, without a copy.
STRATA_API Tensor matmul(const Tensor& a, const Tensor& b);

/// (m, k) x (k, n) -> (m, n); both must be 2-d.
STRATA_API Tensor mm(const Tensor& a, const Tensor& b);

/// (b, m, k) x (b, k, n) -> (b, m, n); both must be 3-d with the same batch size.
STRATA_API Tensor bmm(const Tensor& a, const Tensor& b);

/// The `linear` op's parameters: apply GELU (tanh approximation) to x W^T + b.
struct LinearParams {
  bool gelu_tanh = false;
};

/// x @ weight^T + bias for x (*, in), weight (out, in) and bias (out) or undefined: a result of
/// shape (*, out). Dtypes promote as in matmul. One GEMM over all leading dims of x, with the
/// bias added in the same pass (on CUDA, in cuBLASLt's epilogue).
STRATA_API Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// gelu(linear(x, weight, bias), "tanh"). Without autograd (no input requires grad, or grad
/// mode off) it is one op with GELU fused into the GEMM's epilogue on CUDA; otherwise it
/// records linear and gelu as two ops, so the backward has GELU's input.
STRATA_API Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// The outer product of two 1-d tensors: (n) x (m) -> (n, m).
STRATA_API Tensor outer(const Tensor& a, const Tensor& b);

/// Einstein summation, as torch.einsum: "ij,jk->ik", "bhqd,bhkd->bhqk", "ii->i" (a diagonal),
/// "...ij->...ji" (an ellipsis stands for the remaining dims, broadcast across operands), or,
/// without "->", the output takes the ellipsis dims and then the labels used once, in ASCII
/// order. Labels are letters; a label's sizes must agree or be 1. Labels no later term needs
/// are summed first, then the operands are contracted left to right, one bmm per pair.
STRATA_API Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands);

}  // namespace strata
