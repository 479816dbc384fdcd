// The multi-tensor CUDA updates of the optimizers (internal). Each call updates a batch of
// parameters of one group that share a CUDA device and a dtype (float32 or float64), in a few
// kernel launches on the device's current stream (kernels/cuda/optim_ops.h). Every tensor is
// contiguous and on that device; state tensors exist (created by the optimizer) and have the
// parameter's length. A build without CUDA compiles no_cuda_update.cpp, whose functions raise.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include <strata/core/tensor.hpp>
#include <strata/optim/optimizer.hpp>

#include "kernels/common/optim_math.h"

namespace strata::optim::cuda_update {

struct SgdItem {
  Tensor p, g, buf;  // buf undefined for every item when momentum is 0
  bool first;        // the buffer starts as the gradient
};
void sgd(const std::vector<SgdItem>& items, const math::SgdConsts<double>& c);

struct AdamItem {
  Tensor p, g, m, v, vmax;     // vmax undefined for every item unless AMSGrad
  double step_size, bc2_sqrt;  // this item's: lr / (1 - beta1^t), sqrt(1 - beta2^t)
  const double* corrections = nullptr;  // during graph capture: the two above and the decay, on the device
};
void adam(const std::vector<AdamItem>& items, const math::AdamConsts<double>& c);

struct AdagradItem {
  Tensor p, g, sum;
  double clr;
};
void adagrad(const std::vector<AdagradItem>& items, const math::AdagradConsts<double>& c);

struct RmspropItem {
  Tensor p, g, sq, gavg, buf;  // gavg undefined unless centered, buf unless momentum > 0
};
void rmsprop(const std::vector<RmspropItem>& items, const math::RmspropConsts<double>& c);

struct LambItem {
  Tensor p, g, m, v;
  double bc1, bc2;
};
/// Returns the trust ratios, a float64 tensor on the device with one value per item.
Tensor lamb(const std::vector<LambItem>& items, const math::LambConsts<double>& c, double lr, double clamp_min,
            double clamp_max);

struct Adam8bitItem {
  Tensor p, g, m_codes, m_absmax, v_codes, v_absmax;
  double step_size, bc2_sqrt;
};
void adam8bit(const std::vector<Adam8bitItem>& items, int64_t block, const math::AdamConsts<double>& c);

/// Whether `param`'s current stream is capturing a CUDA graph (false without CUDA).
bool capturing(const Tensor& param);
/// During a capture (Note [Graph replay slots] in src/core/cuda/graph.cpp): `count` doubles
/// on the device that each replay refills with `refill`, which may advance the optimizer's
/// step counts as an eager step would. With count 0, returns nullptr and refill(nullptr)
/// runs at each replay.
const double* replay_slot(const Tensor& param, size_t count, std::function<void(double*)> refill, const char* op);
/// Raises unless every state in `names` exists: created inside a capture, a state would be
/// zero-filled again by every replay (a warm-up step before capture makes them).
void check_states_exist(const ParamState& st, std::initializer_list<const char*> names, const char* op);

/// Raises when `param`'s current stream is capturing a CUDA graph, for the optimizers whose
/// step count a replay does not advance yet (LAMB, Adam8bit, Adagrad, RMSprop). Called before
/// the step count moves. (Nothing to check in a build without CUDA.)
void check_step_not_captured(const Tensor& param, const char* optimizer);

}  // namespace strata::optim::cuda_update
