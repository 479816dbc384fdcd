// Adam8bit: blockwise 8-bit moments for large parameters, fp32 moments (AdamW's loop) for
// small ones; per parameter on the CPU, batched on CUDA (optim/cuda_update.h).
#include <strata/optim/adam8bit.hpp>

#include <array>

#include "kernels/common/quant8.h"
#include "kernels/cpu/optim.h"
#include "optim/adam_consts.h"
#include "optim/cuda_update.h"
#include "optim/update_util.h"

namespace strata::optim {

namespace {

const float* dynamic_map(bool is_signed) {
  static const auto maps = [] {
    std::array<std::array<float, quant8::kMapSize>, 2> m{};
    quant8::build_dynamic_map(m[0].data(), false);
    quant8::build_dynamic_map(m[1].data(), true);
    return m;
  }();
  return maps[is_signed ? 1 : 0].data();
}

int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

bool quantized(const Adam8bitOptions& o, const Tensor& p) { return p.numel() >= o.min_8bit_size && p.numel() > 0; }

// The 8-bit state of `p`, created when missing: zero scales make every code decode to 0, so the
// moments start at zero.
struct Codes {
  Tensor m_codes, m_absmax, v_codes, v_absmax;
};
Codes codes_state(ParamState& st, const Tensor& p, int64_t block) {
  const Shape codes{p.numel()}, scales{num_blocks(p.numel(), block)};
  return {detail::zeros_state(st, "exp_avg_codes", codes, kUInt8, p.device()),
          detail::zeros_state(st, "exp_avg_absmax", scales, kFloat32, p.device()),
          detail::zeros_state(st, "exp_avg_sq_codes", codes, kUInt8, p.device()),
          detail::zeros_state(st, "exp_avg_sq_absmax", scales, kFloat32, p.device())};
}

}  // namespace

void validate_options(const Adam8bitOptions& o) {
  detail::check_nonneg("Adam8bit", "lr", o.lr);
  detail::check_nonneg("Adam8bit", "eps", o.eps);
  detail::check_beta("Adam8bit", "beta1 (betas[0])", o.betas[0]);
  detail::check_beta("Adam8bit", "beta2 (betas[1])", o.betas[1]);
  detail::check_nonneg("Adam8bit", "weight_decay", o.weight_decay);
  STRATA_CHECK(o.min_8bit_size >= 0, "[Adam8bit] invalid min_8bit_size: {} (must be >= 0)", o.min_8bit_size);
  STRATA_CHECK(o.block_size >= 1 && o.block_size <= quant8::kMaxBlock,
               "[Adam8bit] invalid block_size: {} (must be in [1, {}])", o.block_size, quant8::kMaxBlock);
}

Adam8bit::Adam8bit(std::vector<Tensor> params, Adam8bitOptions options)
    : OptimizerFor("Adam8bit", {Group{std::move(params), options}}, options) {}
Adam8bit::Adam8bit(std::vector<Group> groups, Adam8bitOptions defaults)
    : OptimizerFor("Adam8bit", std::move(groups), defaults) {}

std::vector<StateSpec> Adam8bit::state_specs(size_t g, const Tensor& p) const {
  const Adam8bitOptions& o = param_groups()[g].options;
  if (!quantized(o, p)) return {{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}};
  const Shape codes{p.numel()}, scales{num_blocks(p.numel(), o.block_size)};
  return {{"exp_avg_codes", codes, kUInt8},
          {"exp_avg_absmax", scales, kFloat32},
          {"exp_avg_sq_codes", codes, kUInt8},
          {"exp_avg_sq_absmax", scales, kFloat32}};
}

void Adam8bit::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const Adam8bitOptions& o = param_groups()[g].options;
  ++st.step;
  const bool q = quantized(o, p);
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* pp = detail::ptr<T>(p);
    const T* gp = detail::ptr<T>(grad);
    if (!q) {
      auto c = detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, true, o.maximize, st.step);
      cpu::adam_step(pp, gp, detail::ptr<T>(detail::state_tensor(st, "exp_avg", p)),
                     detail::ptr<T>(detail::state_tensor(st, "exp_avg_sq", p)), static_cast<T*>(nullptr), p.numel(),
                     c);
      return;
    }
    auto c = detail::adam_consts<T>(o.lr, o.betas, o.eps, o.weight_decay, true, o.maximize, st.step);
    const Codes s = codes_state(st, p, o.block_size);
    cpu::adam8bit_step(pp, gp, detail::ptr<uint8_t>(s.m_codes), detail::ptr<float>(s.m_absmax),
                       detail::ptr<uint8_t>(s.v_codes), detail::ptr<float>(s.v_absmax), p.numel(), o.block_size,
                       dynamic_map(true), dynamic_map(false), c);
  });
}

void Adam8bit::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  const Adam8bitOptions& o = param_groups()[g].options;
  std::vector<cuda_update::AdamItem> plain;  // fp32 moments: AdamW's kernel
  std::vector<cuda_update::Adam8bitItem> quant;
  for (const ParamUpdate& u : batch) {
    ParamState& st = *u.state;
    ++st.step;
    auto c = detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, true, o.maximize, st.step);
    if (!quantized(o, u.param)) {
      plain.push_back({u.param, u.grad, detail::state_tensor(st, "exp_avg", u.param),
                       detail::state_tensor(st, "exp_avg_sq", u.param), Tensor(), c.step_size, c.bc2_sqrt});
      continue;
    }
    const Codes s = codes_state(st, u.param, o.block_size);
    quant.push_back({u.param, u.grad, s.m_codes, s.m_absmax, s.v_codes, s.v_absmax, c.step_size, c.bc2_sqrt});
  }
  // the group's constants; step_size and bc2_sqrt come from each item
  const auto c = detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, true, o.maximize, 1);
  cuda_update::adam(plain, c);
  cuda_update::adam8bit(quant, o.block_size, c);
}

bool Adam8bit::is_quantized(const Tensor& param) const {
  for (const Group& gr : param_groups())
    for (const Tensor& p : gr.params)
      if (p.is_same(param)) return quantized(gr.options, p);
  return false;
}

Adam8bit::Moments Adam8bit::moments(const Tensor& param) const {
  const ParamState* st = state(param);
  if (!st) return {};
  auto find = [&](const char* name) {
    auto it = st->tensors.find(name);
    STRATA_CHECK(it != st->tensors.end(), "[Adam8bit] the state of the parameter has no '{}'", name);
    return it->second;
  };
  if (st->tensors.count("exp_avg")) return {find("exp_avg").clone(), find("exp_avg_sq").clone()};
  // decoded on the host (a copy of the state when it lives on a GPU), returned on its device
  Tensor mc = find("exp_avg_codes").cpu(), ms = find("exp_avg_absmax").cpu(), vc = find("exp_avg_sq_codes").cpu(),
         vs = find("exp_avg_sq_absmax").cpu();
  int64_t block = 0;
  for (const Group& gr : param_groups())
    for (const Tensor& p : gr.params)
      if (p.is_same(param)) block = gr.options.block_size;
  const int64_t n = mc.numel(), blocks = ms.numel();
  STRATA_CHECK(block > 0 && n == param.numel() && blocks == num_blocks(n, block),
               "[Adam8bit] the 8-bit state ({} codes, {} scales) does not match the parameter ({} elements, "
               "block_size {})",
               n, blocks, param.numel(), block);
  Moments out{empty(param.shape(), param.dtype()), empty(param.shape(), param.dtype())};
  detail::dispatch_param(param.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t k = 0; k < blocks; ++k) {
      int64_t b = k * block, len = std::min(n, b + block) - b;
      quant8::dequantize_block(dynamic_map(true), detail::ptr<uint8_t>(mc) + b, len, detail::ptr<float>(ms)[k],
                               detail::ptr<T>(out.exp_avg) + b);
      quant8::dequantize_block(dynamic_map(false), detail::ptr<uint8_t>(vc) + b, len, detail::ptr<float>(vs)[k],
                               detail::ptr<T>(out.exp_avg_sq) + b);
    }
  });
  if (!param.device().is_cpu()) out = {out.exp_avg.to(param.device()), out.exp_avg_sq.to(param.device())};
  return out;
}

}  // namespace strata::optim
