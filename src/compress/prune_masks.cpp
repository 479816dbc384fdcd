// The mask machinery of pruning: masks as "<name>_mask" buffers, the gradient hook (the forward
// pre-hook is prune_hook.cpp's), remove, reapply_masks and the sparsity report (Note [Keeping
// pruned weights zero] in include/strata/compress/prune.hpp).
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include <strata/autograd/grad_mode.hpp>
#include <strata/compress/prune.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>

#include "compress/prune_internal.h"

namespace strata::compress {

namespace detail {

namespace {

std::string mask_name(const std::string& name) { return name + "_mask"; }


}  // namespace

Tensor find_parameter(nn::Module& module, const std::string& name, std::string_view op) {
  std::vector<std::string> names;
  for (auto& [n, p] : module.named_parameters(false)) {
    if (n == name) return p;
    names.push_back(n);
  }
  strata::detail::throw_error("[{}] {} has no parameter named \"{}\" (it has: {})", op, module.name(), name,
                              fmt::join(names, ", "));
}

Tensor find_mask(nn::Module& module, const std::string& name) {
  for (auto& [n, b] : module.named_buffers(false))
    if (n == mask_name(name)) return b;
  return Tensor();
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.detach().to(kCPU, kFloat64).contiguous();
  const double* p = h.data_ptr<double>();
  return std::vector<double>(p, p + h.numel());
}

std::vector<uint8_t> kept_entries(nn::Module& module, const std::string& name, const Tensor& param) {
  const Tensor mask = find_mask(module, name);
  std::vector<uint8_t> keep(static_cast<size_t>(param.numel()), 1);
  if (!mask.defined()) return keep;
  const std::vector<double> m = host_values(mask);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = m[i] != 0;
  return keep;
}

std::vector<int64_t> smallest(const std::vector<double>& scores, const std::vector<int64_t>& candidates, int64_t k) {
  std::vector<int64_t> order = candidates;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return score_less(scores[static_cast<size_t>(a)], scores[static_cast<size_t>(b)]);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

void check_scores(const Tensor& scores, const Tensor& param, std::string_view op) {
  STRATA_CHECK(scores.shape() == param.shape(), "[{}] importance scores of shape {} must have the parameter's shape {}",
               op, scores.shape(), param.shape());
}

void take_slices(const Tensor& t, int64_t dim, const Tensor& index) {
  if (!t.defined()) return;
  NoGradGuard no_grad;
  Tensor value = index_select(t.detach(), dim, index.to(t.device()));
  const bool channels_last = t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast);
  value = channels_last ? value.contiguous().to(MemoryFormat::ChannelsLast) : value.contiguous();
  t.set_data(value);
  if (t.requires_grad()) t.set_grad(Tensor());
}

void set_mask(nn::Module& module, const std::string& name, const Tensor& param, const std::vector<uint8_t>& keep) {
  const Tensor values = from_vector(keep, param.shape()).to(param.device(), param.dtype());
  Tensor mask = find_mask(module, name);
  const bool first = !mask.defined();
  NoGradGuard no_grad;
  if (first) {
    mask = module.register_buffer(mask_name(name), values);
    // The hook holds the buffer's handle, so it sees a later re-pruning's values, a move by
    // Module::to, and remove()'s emptying, after which it passes gradients through.
    // It holds no handle to the parameter, which owns the hook (a cycle that would never be freed).
    param.register_hook([mask](const Tensor& grad) { return mask.shape() == grad.shape() ? grad * mask : Tensor(); });
  } else {
    mask.copy_(values);  // the module's forward pre-hook already covers this parameter
  }
  param.mul_(mask);
  if (first) attach_mask_hook(module, param, mask);
}

}  // namespace detail

void custom_from_mask(nn::Module& module, const std::string& name, const Tensor& mask) {
  const Tensor param = detail::find_parameter(module, name, "custom_from_mask");
  STRATA_CHECK(mask.defined() && mask.shape() == param.shape(),
               "[custom_from_mask] the mask of shape {} must have the shape of {}'s \"{}\", {}",
               mask.defined() ? mask.shape() : Shape{}, module.name(), name, param.shape());
  std::vector<uint8_t> keep = detail::kept_entries(module, name, param);
  const std::vector<double> m = detail::host_values(mask);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = keep[i] && m[i] != 0;
  detail::set_mask(module, name, param, keep);
}

void identity(nn::Module& module, const std::string& name) {
  custom_from_mask(module, name, ones_like(detail::find_parameter(module, name, "identity")));
}

void remove(nn::Module& module, const std::string& name) {
  const Tensor param = detail::find_parameter(module, name, "prune.remove");
  Tensor mask = detail::find_mask(module, name);
  STRATA_CHECK(mask.defined(), "[prune.remove] parameter \"{}\" of {} has to be pruned before pruning can be removed",
               name, module.name());
  NoGradGuard no_grad;
  param.mul_(mask);
  module.remove_buffer(detail::mask_name(name));
  detail::detach_mask_hook(mask);
  mask.set_data(empty({0}, TensorOptions(param.dtype(), param.device())));  // the gradient hook now passes through
}

namespace {

// f(dotted parameter name, module, parameter name, parameter, mask) for every pruned parameter.
template <class F> void for_each_pruned(nn::Module& root, F&& f) {
  for (auto& [prefix, m] : root.named_modules())
    for (auto& [pname, param] : m->named_parameters(false)) {
      const Tensor mask = detail::find_mask(*m, pname);
      if (mask.defined() && mask.shape() == param.shape())
        f(prefix.empty() ? pname : prefix + "." + pname, *m, pname, param, mask);
    }
}

}  // namespace

bool is_pruned(nn::Module& module) {
  bool any = false;
  for_each_pruned(module, [&](auto&&...) { any = true; });
  return any;
}

void reapply_masks(nn::Module& module) {
  NoGradGuard no_grad;
  for_each_pruned(module, [](const std::string&, nn::Module&, const std::string&, const Tensor& param,
                             const Tensor& mask) { param.mul_(mask); });
}

SparsityReport sparsity_report(nn::Module& module, bool pruned_only) {
  SparsityReport report;
  report.total.name = "total";
  auto add = [&](const std::string& full_name, const Tensor& param) {
    const std::vector<double> v = detail::host_values(param);
    SparsityEntry e{full_name, std::count(v.begin(), v.end(), 0.0), param.numel()};
    report.total.zeros += e.zeros;
    report.total.numel += e.numel;
    report.entries.push_back(std::move(e));
  };
  if (pruned_only) {
    for_each_pruned(module, [&](const std::string& full_name, nn::Module&, const std::string&, const Tensor& param,
                                const Tensor&) { add(full_name, param); });
  } else {
    for (auto& [full_name, param] : module.named_parameters()) add(full_name, param);
  }
  return report;
}

std::string SparsityReport::to_string() const {
  auto line = [](const SparsityEntry& e) {
    return fmt::format("{:<40} {:>10} / {:<10} {:6.2f}%\n", e.name, e.zeros, e.numel, 100.0 * e.sparsity());
  };
  std::string out;
  for (const SparsityEntry& e : entries) out += line(e);
  return out + line(total);
}

}  // namespace strata::compress
