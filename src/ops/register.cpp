// The list of op families whose built-in kernels the registry loads at first use.
#include "core/registry_internal.h"

namespace strata::detail {

void register_copy_kernels(KernelTable&);
void register_creation_kernels(KernelTable&);
void register_unary_kernels(KernelTable&);
void register_binary_kernels(KernelTable&);
void register_activation_grad_kernels(KernelTable&);
void register_reduce_kernels(KernelTable&);
void register_reduce_stats_kernels(KernelTable&);
void register_softmax_kernels(KernelTable&);
void register_matmul_kernels(KernelTable&);
void register_linear_kernels(KernelTable&);

void register_index_kernels(KernelTable&);
void register_triangular_kernels(KernelTable&);
void register_sort_kernels(KernelTable&);
void register_compare_kernels(KernelTable&);
void register_layer_norm_kernels(KernelTable&);
void register_cross_entropy_kernels(KernelTable&);
void register_attention_kernels(KernelTable&);
void register_dropout_kernels(KernelTable&);
void register_conv_kernels(KernelTable&);
void register_conv3d_kernels(KernelTable&);
void register_pool_kernels(KernelTable&);
void register_pool3d_kernels(KernelTable&);
void register_batch_norm_kernels(KernelTable&);
void register_cuda_kernels(KernelTable&);  // src/ops/cuda/register.cpp, or empty without CUDA

void register_builtin_kernels(KernelTable& table) {
  register_copy_kernels(table);
  register_creation_kernels(table);
  register_unary_kernels(table);
  register_binary_kernels(table);
  register_activation_grad_kernels(table);
  register_reduce_kernels(table);
  register_reduce_stats_kernels(table);
  register_softmax_kernels(table);
  register_matmul_kernels(table);
  register_linear_kernels(table);
  register_index_kernels(table);
  register_triangular_kernels(table);
  register_sort_kernels(table);
  register_compare_kernels(table);
  register_layer_norm_kernels(table);
  register_cross_entropy_kernels(table);
  register_attention_kernels(table);
  register_dropout_kernels(table);
  register_conv_kernels(table);
  register_conv3d_kernels(table);
  register_pool_kernels(table);
  register_pool3d_kernels(table);
  register_batch_norm_kernels(table);
  register_cuda_kernels(table);
}

}  // namespace strata::detail
