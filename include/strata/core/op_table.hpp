// Every built-in op that runs a kernel, declared once: X(name, inputs, differentiable).
// Adding an op is a fixed checklist: a row here, its CPU kernel, its CUDA kernel, its
// backward beside its forward, and a row in its family's test table.
#pragma once

#define STRATA_OP_TABLE(X)                                                          \
  /* creation and copies */                                                         \
  X(fill, 0, false) X(copy, 1, true) X(uniform, 0, false) X(normal, 0, false)       \
  X(randint, 0, false) X(arange, 0, false)                                          \
  /* unary */                                                                       \
  X(neg, 1, true) X(abs, 1, true) X(sign, 1, false) X(exp, 1, true) X(log, 1, true) \
  X(sqrt, 1, true) X(rsqrt, 1, true) X(sin, 1, true) X(cos, 1, true)                \
  X(tanh, 1, true) X(sigmoid, 1, true) X(relu, 1, true) X(gelu, 1, true)            \
  X(gelu_tanh, 1, true) X(silu, 1, true) X(square, 1, true) X(reciprocal, 1, true)  \
  X(logical_not, 1, false) X(pow_scalar, 1, true) X(clamp, 1, true)                 \
  X(leaky_relu, 1, true) X(erf, 1, true) X(log1p, 1, true) X(expm1, 1, true)       \
  X(floor, 1, false) X(ceil, 1, false) X(round, 1, false) X(trunc, 1, false)        \
  X(tan, 1, true) X(asin, 1, true) X(acos, 1, true) X(atan, 1, true)                \
  X(sinh, 1, true) X(cosh, 1, true) X(asinh, 1, true) X(acosh, 1, true)             \
  X(atanh, 1, true) X(log2, 1, true) X(log10, 1, true) X(exp2, 1, true)             \
  /* activation gradients: (grad, saved input or output) -> grad input */           \
  X(relu_backward, 2, true) X(gelu_backward, 2, true)                               \
  X(gelu_tanh_backward, 2, true) X(tanh_backward, 2, true)                          \
  X(sigmoid_backward, 2, true) X(silu_backward, 2, true)                            \
  /* binary */                                                                      \
  X(add, 2, true) X(sub, 2, true) X(mul, 2, true) X(div, 2, true)                   \
  X(maximum, 2, true) X(minimum, 2, true) X(pow, 2, true) X(eq, 2, false)           \
  X(ne, 2, false) X(lt, 2, false) X(le, 2, false) X(gt, 2, false) X(ge, 2, false)   \
  X(logical_and, 2, false) X(logical_or, 2, false) X(where, 3, true)                \
  X(remainder, 2, true) X(fmod, 2, true) X(atan2, 2, true)                          \
  /* reductions */                                                                  \
  X(sum, 1, true) X(prod, 1, true) X(amax, 1, true) X(amin, 1, true)                \
  X(argmax, 1, false) X(argmin, 1, false) X(var, 1, true) X(logsumexp, 1, true)     \
  X(norm, 1, true) X(softmax, 1, true) X(log_softmax, 1, true) X(cumsum, 1, true)   \
  X(mean, 1, true) X(cumprod, 1, true)                                              \
  /* linear algebra */                                                              \
  X(matmul, 2, true) X(linear, 3, true)                                            \
  /* indexing and ordering */                                                       \
  X(index_select, 2, true) X(gather, 2, true) X(scatter, 3, true)                   \
  X(scatter_add, 3, true) X(index_add, 3, true) X(tril, 1, true) X(triu, 1, true)   \
  X(sort, 1, false) X(topk, 1, false) X(isclose, 2, false)                          \
  /* nn */                                                                          \
  X(layer_norm, 3, true) X(layer_norm_backward, 5, false) X(dropout, 1, true)      \
  X(cross_entropy_fused, 3, true) X(cross_entropy_fused_backward, 5, false)        \
  X(attention, 3, true) X(attention_backward, 6, false)                            \
  /* nn: convolution, pooling, batch norm */                                        \
  X(conv2d, 3, true) X(conv2d_backward_input, 2, false)                             \
  X(conv2d_backward_weight, 2, false) X(max_pool2d, 1, true)                        \
  X(max_pool2d_backward, 2, false) X(avg_pool2d, 1, true)                           \
  X(avg_pool2d_backward, 1, false) X(adaptive_avg_pool2d, 1, true)                  \
  X(adaptive_avg_pool2d_backward, 1, false) X(batch_norm, 5, true)                  \
  X(batch_norm_backward, 5, false) X(conv3d, 3, true)                               \
  X(conv3d_backward_input, 2, false) X(conv3d_backward_weight, 2, false)            \
  X(max_pool3d, 1, true) X(max_pool3d_backward, 2, false) X(avg_pool3d, 1, true)   \
  X(avg_pool3d_backward, 1, false) X(adaptive_avg_pool3d, 1, true)                  \
  X(adaptive_avg_pool3d_backward, 1, false) X(adaptive_max_pool3d, 1, true)        \
  /* softmax gradients: (y, g) -> dx */                                             \
  X(softmax_backward, 2, false) X(log_softmax_backward, 2, false)

// Bump this when adding a row, so the count is a conscious change.
#define STRATA_NUM_BUILTIN_OPS 127
