// The oneDNN convolution backend in a build without oneDNN: it handles nothing, so every
// convolution goes to the reference in conv_ref.cpp.
#include "conv.h"

namespace strata::cpu {

bool conv_forward_dnnl(const ConvProblem&) { return false; }
bool conv_backward_data_dnnl(const ConvProblem&) { return false; }
bool conv_backward_weights_dnnl(const ConvProblem&) { return false; }
bool conv3d_forward_dnnl(const Conv3dProblem&) { return false; }
bool conv3d_backward_data_dnnl(const Conv3dProblem&) { return false; }
bool conv3d_backward_weights_dnnl(const Conv3dProblem&) { return false; }
bool conv_dnnl_available() { return false; }

int64_t conv_dnnl_cache_size() { return 0; }

}  // namespace strata::cpu
