// cuDNN for the CUDA launchers (internal): the status check, the handle of each (device,
// thread) bound to the current stream, and owning descriptor wrappers.
//
// Every cuDNN call goes through STRATA_CUDNN_CHECK, so a failure raises strata::Error
// "[conv2d] cudnnConvolutionForward(...) failed: CUDNN_STATUS_NOT_SUPPORTED".
#pragma once

#include <cudnn.h>

#include <strata/core/error.hpp>

#define STRATA_CUDNN_CHECK(call, op) ::strata::cuda::cudnn_check((call), #call, op)

namespace strata::cuda {

/// Raises "[op] call failed: <cuDNN's error string>" unless status is success.
inline void cudnn_check(cudnnStatus_t status, const char* call, const char* op) {
  STRATA_CHECK(status == CUDNN_STATUS_SUCCESS, "[{}] {} failed: {}", op, call, cudnnGetErrorString(status));
}

/// cuDNN's "not supported" family (CUDNN_STATUS_NOT_SUPPORTED and its sub-codes): the
/// problem or the algorithm is outside what cuDNN implements, which a caller may work around.
inline bool cudnn_not_supported(cudnnStatus_t status) { return status >= 3000 && status < 4000; }

/// The calling thread's cuDNN handle for `device` (created on first use, destroyed when the
/// thread exits), set to run on `stream`. The device must be current.
cudnnHandle_t cudnn_handle(int device, cudaStream_t stream, const char* op);

/// An owning cuDNN descriptor: Create on construction, Destroy on destruction.
template <class Desc, cudnnStatus_t (*Create)(Desc*), cudnnStatus_t (*Destroy)(Desc)>
class CudnnDescriptor {
 public:
  explicit CudnnDescriptor(const char* op) { STRATA_CUDNN_CHECK(Create(&desc_), op); }
  ~CudnnDescriptor() { Destroy(desc_); }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  Desc get() const { return desc_; }

 private:
  Desc desc_ = nullptr;
};

using TensorDescriptor = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                         cudnnDestroyTensorDescriptor>;
using FilterDescriptor = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                         cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                              cudnnDestroyConvolutionDescriptor>;

}  // namespace strata::cuda
