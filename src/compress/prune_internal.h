// What the pruning files share: finding a module's parameter and its mask, ranking scores on
// the host, and installing a mask (Note [Keeping pruned weights zero] in
// include/strata/compress/prune.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/tensor.hpp>
#include <strata/nn/module.hpp>

namespace strata::compress::detail {

/// The module's own parameter `name`; raises Error naming `op`, the module and the parameters
/// it has when there is none.
Tensor find_parameter(nn::Module& module, const std::string& name, std::string_view op);
/// The module's "<name>_mask" buffer, undefined when the parameter is not pruned.
Tensor find_mask(nn::Module& module, const std::string& name);
/// The elements of `t` (any dtype or device) as doubles in C order.
std::vector<double> host_values(const Tensor& t);
/// Which entries the current mask keeps (all when the parameter is not pruned).
std::vector<uint8_t> kept_entries(nn::Module& module, const std::string& name, const Tensor& param);
/// Ranks scores ascending with NaN above every number, as torch.topk does (so a NaN weight is
/// not pruned first), as the strict weak order std::stable_sort needs.
inline bool score_less(double x, double y) { return !std::isnan(x) && (std::isnan(y) || x < y); }
/// What each list of scores keeps (ascending indices) when the `k` smallest scores of all the
/// lists together are removed, list i keeping at least `min_left[i]` (an entry that would take a
/// list below is passed over); raises Error naming `op` when k cannot be met so.
std::vector<std::vector<int64_t>> keep_after_removing(const std::vector<std::vector<double>>& scores, int64_t k,
                                                      const std::vector<int64_t>& min_left, std::string_view op);
/// The `k` entries of `candidates` with the smallest scores; ties go to the lower index.
std::vector<int64_t> smallest(const std::vector<double>& scores, const std::vector<int64_t>& candidates, int64_t k);
/// Installs `keep` (1 keeps, 0 prunes; the parameter's numel, C order) as the parameter's
/// mask, replacing the values of an existing mask buffer or registering one, and zeroes the
/// pruned entries of the parameter.
void set_mask(nn::Module& module, const std::string& name, const Tensor& param, const std::vector<uint8_t>& keep);
/// Replaces t (when defined) by its slices `index` along dim, keeping the handle (the module's
/// members and registrations, a mask's hooks see the new value) and a channels-last layout;
/// drops its gradient, which has the old shape.
void take_slices(const Tensor& t, int64_t dim, const Tensor& index);
/// Registers `param` and its new `mask` with the forward pre-hook of `module` that multiplies
/// each pruned parameter by its mask when either changed since (prune_hook.cpp), registering the
/// hook with the module's first mask.
void attach_mask_hook(nn::Module& module, const Tensor& param, const Tensor& mask);
/// Takes `mask`'s parameter off its module's hook, and removes the hook with the last one.
void detach_mask_hook(const Tensor& mask);
/// Raises Error naming `op` unless `scores` is defined with `param`'s shape.
void check_scores(const Tensor& scores, const Tensor& param, std::string_view op);

}  // namespace strata::compress::detail
