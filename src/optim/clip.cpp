// Gradient clipping composed of strata ops (norm, stack, mul_, clamp_), so it runs wherever the
// grads live. The per-grad norms stay on their device, are combined there in float64 into one
// norm per device, and the host waits once per device for that value.
#include <strata/optim/clip.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>

#include "core/tensor_internal.h"

namespace strata::optim {

namespace {

std::vector<Tensor> defined_grads(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    STRATA_CHECK(params[i].defined(), "[{}] parameter {} is an undefined tensor", op, i);
    if (params[i].grad().defined()) grads.push_back(params[i].grad());
  }
  return grads;
}

// The grads, each checked to take an in-place write before any is written, so that an error
// leaves every grad as it was.
std::vector<Tensor> writable_grads(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads = defined_grads(params, op);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    STRATA_CHECK(is_floating(g.dtype()), "[{}] the grad of parameter {} has dtype {}: only floating grads can be "
                 "clipped", op, i, g.dtype());
    STRATA_CHECK(!detail::elements_share_memory(g),
                 "[{}] the grad of parameter {} (shape {}, strides {}) is an expanded view whose elements share "
                 "memory, so it cannot be scaled in place; set a grad of its own (grad.clone())",
                 op, i, g.shape(), g.strides());
  }
  return grads;
}

// The norm of the grads as if concatenated: the norm of their norms, as torch's
// clip_grad_norm_ takes it (||(||g_1||, ..., ||g_k||)||_p).
double total_norm(const std::vector<Tensor>& grads, double p) {
  const bool inf = std::isinf(p);
  std::map<std::pair<int, int>, std::vector<Tensor>> by_device;  // (device type, index) -> norms
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;  // contributes nothing (and has no inf norm of its own)
    const Device d = g.device();
    by_device[{static_cast<int>(d.type), d.index}].push_back(norm(g.detach(), p).to(kFloat64));
  }
  double acc = 0;
  for (const auto& [device, norms] : by_device) {
    const double n = norm(stack(norms), p).item_scalar().to_double();  // the one wait per device
    if (by_device.size() == 1) return n;
    if (inf) acc = (n > acc || std::isnan(n)) ? n : acc;
    else acc += std::pow(n, p);
  }
  return inf ? acc : std::pow(acc, 1.0 / p);
}

void check_norm_type(double p, const char* op) {
  STRATA_CHECK(p > 0, "[{}] norm_type must be > 0 or inf, got {}", op, p);
}

}  // namespace

double total_grad_norm(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type, "total_grad_norm");
  NoGradGuard no_grad;
  return total_norm(defined_grads(params, "total_grad_norm"), norm_type);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type, "clip_grad_norm_");
  // a negative max_norm would flip the grads' sign
  STRATA_CHECK(max_norm >= 0, "[clip_grad_norm_] max_norm must be >= 0 (or inf: no clipping), got {}", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads = writable_grads(params, "clip_grad_norm_");
  if (grads.empty()) return 0.0;
  const double total = total_norm(grads, norm_type);
  STRATA_CHECK(!error_if_nonfinite || std::isfinite(total),
               "[clip_grad_norm_] the total norm of order {} of the gradients of {} parameters is {}, so it cannot be "
               "clipped; pass error_if_nonfinite = false to scale them anyway",
               norm_type, grads.size(), total);
  if (std::isinf(max_norm)) return total;  // no limit, even for an infinite total (PyTorch would scale by NaN)
  const double coef = max_norm / (total + 1e-6);
  const double clamped = 1.0 < coef ? 1.0 : coef;  // NaN stays NaN, as torch.clamp(max=1)
  if (clamped != 1.0)
    for (Tensor& g : grads) g.mul_(clamped);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  STRATA_CHECK(clip_value >= 0, "[clip_grad_value_] clip_value must be >= 0, got {}", clip_value);
  NoGradGuard no_grad;
  for (Tensor& g : writable_grads(params, "clip_grad_value_")) g.clamp_(-clip_value, clip_value);
}

}  // namespace strata::optim
