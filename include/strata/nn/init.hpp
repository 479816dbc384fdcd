// nn::init: in-place initializers for parameters, with PyTorch's names and formulas (fans,
// gains, bounds). Each runs under NoGradGuard, works on any device and floating dtype, and
// draws from `gen` (default_generator() when null).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>

namespace strata::nn::init {

/// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field, where the
/// receptive field is the product of dims 2 and up. Needs at least 2 dims.
struct Fans {
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
STRATA_API Fans calculate_fan_in_and_fan_out(const Tensor& t);

/// The recommended gain for a nonlinearity: linear, conv*, sigmoid: 1; tanh: 5/3; relu:
/// sqrt(2); leaky_relu: sqrt(2 / (1 + slope^2)) with slope = param (0.01 when not given);
/// selu: 3/4. Raises Error for any other name.
STRATA_API double calculate_gain(std::string_view nonlinearity, std::optional<double> param = std::nullopt);

STRATA_API Tensor& uniform_(Tensor& t, double a = 0, double b = 1, Generator* gen = nullptr);
STRATA_API Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
/// Normal(mean, std) restricted to [a, b] (by inverting the CDF, so no value falls outside).
STRATA_API Tensor& trunc_normal_(Tensor& t, double mean = 0, double std = 1, double a = -2, double b = 2,
                                 Generator* gen = nullptr);
STRATA_API Tensor& constant_(Tensor& t, double value);
STRATA_API Tensor& zeros_(Tensor& t);
STRATA_API Tensor& ones_(Tensor& t);

/// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
STRATA_API Tensor& xavier_uniform_(Tensor& t, double gain = 1, Generator* gen = nullptr);
/// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
STRATA_API Tensor& xavier_normal_(Tensor& t, double gain = 1, Generator* gen = nullptr);
/// U(-bound, bound) with bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a),
/// fan = fan_in or fan_out by mode ("fan_in" | "fan_out").
STRATA_API Tensor& kaiming_uniform_(Tensor& t, double a = 0, std::string_view mode = "fan_in",
                                    std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// N(0, std^2) with std = gain / sqrt(fan).
STRATA_API Tensor& kaiming_normal_(Tensor& t, double a = 0, std::string_view mode = "fan_in",
                                   std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// A (semi-)orthogonal matrix over t flattened to (size(0), rest), scaled by gain: the Q of a
/// QR factorization of a normal matrix, computed in float64 on the CPU. Needs >= 2 dims.
STRATA_API Tensor& orthogonal_(Tensor& t, double gain = 1, Generator* gen = nullptr);

}  // namespace strata::nn::init
