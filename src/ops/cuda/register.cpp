// The CUDA op families whose kernels the registry loads at first use, in CUDA builds
// (a build without CUDA compiles src/ops/no_cuda_kernels.cpp instead).
#include "core/registry_internal.h"

namespace strata::detail {

void register_cuda_unary_kernels(KernelTable&);
void register_cuda_binary_kernels(KernelTable&);
void register_cuda_activation_grad_kernels(KernelTable&);
void register_cuda_copy_kernels(KernelTable&);
void register_cuda_creation_kernels(KernelTable&);
void register_cuda_matmul_kernels(KernelTable&);
void register_cuda_layer_norm_kernels(KernelTable&);
void register_cuda_cross_entropy_kernels(KernelTable&);
void register_cuda_reduce_kernels(KernelTable&);
void register_cuda_softmax_kernels(KernelTable&);
void register_cuda_index_kernels(KernelTable&);
void register_cuda_sort_kernels(KernelTable&);
void register_cuda_dropout_kernels(KernelTable&);
void register_cuda_conv_kernels(KernelTable&);
void register_cuda_pool_kernels(KernelTable&);
void register_cuda_pool3d_kernels(KernelTable&);
void register_cuda_batch_norm_kernels(KernelTable&);
void register_cuda_attention_kernels(KernelTable&);

void register_cuda_kernels(KernelTable& table) {
  register_cuda_unary_kernels(table);
  register_cuda_binary_kernels(table);
  register_cuda_activation_grad_kernels(table);
  register_cuda_copy_kernels(table);
  register_cuda_creation_kernels(table);
  register_cuda_matmul_kernels(table);
  register_cuda_layer_norm_kernels(table);
  register_cuda_cross_entropy_kernels(table);
  register_cuda_reduce_kernels(table);
  register_cuda_softmax_kernels(table);
  register_cuda_index_kernels(table);
  register_cuda_sort_kernels(table);
  register_cuda_dropout_kernels(table);
  register_cuda_conv_kernels(table);
  register_cuda_pool_kernels(table);
  register_cuda_pool3d_kernels(table);
  register_cuda_batch_norm_kernels(table);
  register_cuda_attention_kernels(table);
}

}  // namespace strata::detail
