// 8-bit Adam (Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization"): AdamW's
// update with both moments stored as uint8 codes plus one fp32 absmax scale per block of
// block_size elements (kernels/common/quant8.h): the first moment in the signed dynamic map,
// the second in the unsigned one. About 2 bytes of state per parameter instead of 8.
// Each step dequantizes a block, applies the fp32 AdamW step (optim_math.h), and requantizes
// the new moments to the nearest code. Weight decay is decoupled, as in AdamW (and in
// bitsandbytes). Parameters with fewer than min_8bit_size elements keep fp32 moments
// ("exp_avg", "exp_avg_sq") and are updated exactly as AdamW updates them, as do channels-last
// parameters (Module::to(MemoryFormat)), whose memory is not in the codes' order. A change of
// min_8bit_size or block_size between steps requantizes or dequantizes the moments.
// Quantized state: "exp_avg_codes", "exp_avg_absmax", "exp_avg_sq_codes", "exp_avg_sq_absmax".
#pragma once

#include <array>
#include <cstdint>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct Adam8bitOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool maximize = false;
  int64_t min_8bit_size = 4096;
  int64_t block_size = 2048;  ///< elements per absmax scale, 1 to 4096 (2048 or 256 usual)

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("maximize", o.maximize), f("min_8bit_size", o.min_8bit_size);
    f("block_size", o.block_size);
  }
};

/// Raises Error for lr, eps, weight_decay or min_8bit_size < 0, a beta outside [0, 1), or a
/// block size outside [1, 4096].
STRATA_API void validate_options(const Adam8bitOptions& o);

class STRATA_API Adam8bit : public OptimizerFor<Adam8bitOptions> {
 public:
  explicit Adam8bit(std::vector<Tensor> params, Adam8bitOptions options = {});
  explicit Adam8bit(std::vector<Group> groups, Adam8bitOptions defaults = {});

  /// Both moments of `param` as tensors of its shape and dtype (dequantized when stored in
  /// 8 bits); undefined tensors before the first update.
  struct Moments {
    Tensor exp_avg, exp_avg_sq;
  };
  Moments moments(const Tensor& param) const;
  /// Whether `param`'s moments are stored in 8 bits under its group's options.
  bool is_quantized(const Tensor& param) const;

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
  std::optional<ParamState> converted_state(size_t group, const Tensor& param, const ParamState& st) const override;
  ParamState state_from_dict(size_t group, const Tensor& param, ParamState st) const override;
};

}  // namespace strata::optim
