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

// The flat codes follow the parameter's memory, which must then be in C order: a channels-last
// parameter keeps 32-bit moments (Note [Parameter layouts] in update_util.h).
bool quantized(const Adam8bitOptions& o, const Tensor& p) {
  return p.numel() >= o.min_8bit_size && p.numel() > 0 && p.is_contiguous();
}

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

const Tensor& state_at(const ParamState& st, const char* name) {
  auto it = st.tensors.find(name);
  STRATA_CHECK(it != st.tensors.end(), "[Adam8bit] the state of the parameter has no '{}'", name);
  return it->second;
}

// A state tensor, contiguous on the host (a copy when it lives on a GPU).
Tensor host_state(const ParamState& st, const char* name) { return state_at(st, name).cpu().contiguous(); }

// The moments of an 8-bit state quantized in blocks of `block`, as tensors of p's shape and
// dtype on its device.
Adam8bit::Moments decode(const ParamState& st, const Tensor& p, int64_t block) {
  Tensor mc = host_state(st, "exp_avg_codes"), ms = host_state(st, "exp_avg_absmax"),
         vc = host_state(st, "exp_avg_sq_codes"), vs = host_state(st, "exp_avg_sq_absmax");
  const int64_t n = p.numel(), blocks = num_blocks(n, block);
  STRATA_CHECK(mc.numel() == n && vc.numel() == n && ms.numel() == blocks && vs.numel() == blocks &&
                   mc.dtype() == kUInt8 && vc.dtype() == kUInt8 && ms.dtype() == kFloat32 && vs.dtype() == kFloat32,
               "[Adam8bit] the 8-bit state ({} codes, {} scales) does not match the parameter ({} elements, "
               "block_size {}): was the parameter replaced after the optimizer was built?",
               mc.numel(), ms.numel(), n, block);
  Adam8bit::Moments out{empty(p.shape(), p.dtype()), empty(p.shape(), p.dtype())};
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t k = 0; k < blocks; ++k) {
      int64_t b = k * block, len = std::min(n, b + block) - b;
      quant8::dequantize_block(dynamic_map(true), detail::ptr<uint8_t>(mc) + b, len, detail::ptr<float>(ms)[k],
                               detail::ptr<T>(out.exp_avg) + b);
      quant8::dequantize_block(dynamic_map(false), detail::ptr<uint8_t>(vc) + b, len, detail::ptr<float>(vs)[k],
                               detail::ptr<T>(out.exp_avg_sq) + b);
    }
  });
  if (!p.device().is_cpu()) out = {out.exp_avg.to(p.device()), out.exp_avg_sq.to(p.device())};
  return out;
}

// Stores moments m and v (p's shape and dtype) in 8 bits in blocks of `block`, as a step does.
void encode(ParamState& st, const Tensor& m, const Tensor& v, const Tensor& p, int64_t block) {
  STRATA_CHECK(m.numel() == p.numel() && v.numel() == p.numel() && m.dtype() == p.dtype() && v.dtype() == p.dtype(),
               "[Adam8bit] the moments ({} {}) do not match the parameter (shape {}, {}): was the parameter "
               "replaced after the optimizer was built?",
               m.shape(), m.dtype(), p.shape(), p.dtype());
  const Tensor mh = m.cpu().contiguous(), vh = v.cpu().contiguous();
  const int64_t n = p.numel(), blocks = num_blocks(n, block);
  Tensor mc = empty({n}, kUInt8), ms = empty({blocks}, kFloat32), vc = empty({n}, kUInt8),
         vs = empty({blocks}, kFloat32);
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t k = 0; k < blocks; ++k) {
      int64_t b = k * block, len = std::min(n, b + block) - b;
      float& m_scale = detail::ptr<float>(ms)[k];
      float& v_scale = detail::ptr<float>(vs)[k];
      m_scale = quant8::block_absmax(detail::ptr<T>(mh) + b, len);
      v_scale = quant8::block_absmax(detail::ptr<T>(vh) + b, len);
      quant8::quantize_block(dynamic_map(true), detail::ptr<T>(mh) + b, len, m_scale, detail::ptr<uint8_t>(mc) + b);
      quant8::quantize_block(dynamic_map(false), detail::ptr<T>(vh) + b, len, v_scale, detail::ptr<uint8_t>(vc) + b);
    }
  });
  st.tensors["exp_avg_codes"] = mc.to(p.device());
  st.tensors["exp_avg_absmax"] = ms.to(p.device());
  st.tensors["exp_avg_sq_codes"] = vc.to(p.device());
  st.tensors["exp_avg_sq_absmax"] = vs.to(p.device());
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

// A parameter crossing min_8bit_size, or a new block_size, keeps its moments (requantized or
// dequantized) and its step count (Note [Option changes] in optimizer.cpp).
std::optional<ParamState> Adam8bit::converted_state(size_t g, const Tensor& p, const ParamState& st) const {
  const Adam8bitOptions& o = param_groups()[g].options;
  const int64_t old_block = synced_options(g).block_size;
  const bool want8 = quantized(o, p), has8 = st.tensors.count("exp_avg_codes") > 0,
             has32 = st.tensors.count("exp_avg") > 0;
  const bool move = (has8 && (!want8 || old_block != o.block_size)) || (has32 && want8);
  if (!move) return Optimizer::converted_state(g, p, st);
  const Moments mv = has8 ? decode(st, p, old_block) : Moments{state_at(st, "exp_avg"), state_at(st, "exp_avg_sq")};
  ParamState out{st.step, {}};
  if (want8) encode(out, mv.exp_avg, mv.exp_avg_sq, p, o.block_size);
  else out.tensors = {{"exp_avg", mv.exp_avg}, {"exp_avg_sq", mv.exp_avg_sq}};
  return out;
}

// A dict saved for the other memory layout of the parameter (Note [Parameter layouts]): 8-bit
// codes for a channels-last parameter, which keeps 32-bit moments, or 32-bit moments for a
// contiguous one that quantizes. The codes were made in blocks of the dict's block_size, which
// load_state_dict has already made the group's.
ParamState Adam8bit::state_from_dict(size_t g, const Tensor& p, ParamState st) const {
  const Adam8bitOptions& o = param_groups()[g].options;
  const bool want8 = quantized(o, p), has8 = st.tensors.count("exp_avg_codes") > 0,
             has32 = st.tensors.count("exp_avg") > 0 || st.tensors.count("exp_avg_sq") > 0;
  if (want8 && has32 && !has8) {
    auto moment = [&](const char* name) {
      auto it = st.tensors.find(name);
      return it != st.tensors.end() && it->second.defined() && it->second.shape() == p.shape() &&
                     is_floating(it->second.dtype())
                 ? it->second.to(p.dtype())
                 : Tensor();
    };
    const Tensor m = moment("exp_avg"), v = moment("exp_avg_sq");
    if (!m.defined() || !v.defined() || st.tensors.size() != 2) return st;  // the checks name the problem
    ParamState out{st.step, {}};
    encode(out, m, v, p, o.block_size);
    return out;
  }
  if (!want8 && has8 && !has32) {
    const int64_t n = p.numel(), blocks = num_blocks(n, o.block_size);
    auto fits = [&](const char* name, int64_t size, DType dtype) {
      auto it = st.tensors.find(name);
      return it != st.tensors.end() && it->second.defined() && it->second.shape() == Shape{size} &&
             it->second.dtype() == dtype;
    };
    if (!fits("exp_avg_codes", n, kUInt8) || !fits("exp_avg_sq_codes", n, kUInt8) ||
        !fits("exp_avg_absmax", blocks, kFloat32) || !fits("exp_avg_sq_absmax", blocks, kFloat32) ||
        st.tensors.size() != 4)
      return st;
    const Moments mv = decode(st, p, o.block_size);  // moments in the logical order, as codes are
    return ParamState{st.step, {{"exp_avg", mv.exp_avg}, {"exp_avg_sq", mv.exp_avg_sq}}};
  }
  return st;
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
  if (!batch.empty()) cuda_update::check_step_not_captured(batch[0].param, "Adam8bit");
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
  if (st->tensors.count("exp_avg")) return {state_at(*st, "exp_avg").clone(), state_at(*st, "exp_avg_sq").clone()};
  // the codes are in the blocks of the last step or load: a block_size set since applies from the next step
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : param_groups()[g].params)
      if (p.is_same(param)) return decode(*st, param, synced_options(g).block_size);
  strata::detail::throw_error("[Adam8bit] the parameter has state but is in no param group");
}

}  // namespace strata::optim
