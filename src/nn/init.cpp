// nn::init: fans, gains and the in-place initializers. Random values come from the Philox
// factories (so they depend only on the generator's state); trunc_normal_ and orthogonal_
// transform such draws in float64 on the CPU and copy the result in.
#include <cmath>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/init.hpp>
#include <strata/ops/creation.hpp>

namespace strata::nn::init {

namespace {

void check_param(const Tensor& t, std::string_view op) {
  STRATA_CHECK(t.defined(), "[{}] tensor is undefined", op);
  STRATA_CHECK(is_floating(t.dtype()), "[{}] expects a floating tensor, got {}", op, t.dtype());
}

int64_t fan_for(const Tensor& t, std::string_view mode, std::string_view op) {
  STRATA_CHECK(mode == "fan_in" || mode == "fan_out", "[{}] mode must be \"fan_in\" or \"fan_out\", got \"{}\"", op,
               mode);
  Fans f = calculate_fan_in_and_fan_out(t);
  return mode == "fan_in" ? f.fan_in : f.fan_out;
}

// The inverse of erf on (-1, 1): Giles' single-precision approximation refined by two Newton
// steps in double, accurate to a few ulps.
double erfinv(double y) {
  if (y <= -1) return -INFINITY;
  if (y >= 1) return INFINITY;
  double w = -std::log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941})
      x = c + x * w;
  } else {
    w = std::sqrt(w) - 3.0;
    x = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682})
      x = c + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
  return x;
}

// Copies float64 CPU values (C order of t's shape) into t.
void assign(Tensor& t, const std::vector<double>& values) {
  t.copy_(from_vector(values, t.shape()));
}

}  // namespace

Fans calculate_fan_in_and_fan_out(const Tensor& t) {
  STRATA_CHECK(t.defined(), "[calculate_fan_in_and_fan_out] tensor is undefined");
  STRATA_CHECK(t.dim() >= 2, "[calculate_fan_in_and_fan_out] fans need a tensor of at least 2 dims, got shape {}",
               t.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return Fans{t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(std::string_view nonlinearity, std::optional<double> param) {
  for (std::string_view one : {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                               "conv_transpose3d", "sigmoid"})
    if (nonlinearity == one) return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (nonlinearity == "selu") return 0.75;
  detail::throw_error("[calculate_gain] unsupported nonlinearity \"{}\"", nonlinearity);
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  check_param(t, "uniform_");
  NoGradGuard no_grad;
  return strata::uniform_(t, a, b, gen);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_param(t, "normal_");
  NoGradGuard no_grad;
  return strata::normal_(t, mean, std, gen);
}

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  check_param(t, "trunc_normal_");
  STRATA_CHECK(std >= 0 && a <= b, "[trunc_normal_] needs std >= 0 and a <= b, got std {}, a {}, b {}", std, a, b);
  NoGradGuard no_grad;
  if (std == 0) {  // a point mass (the CDF has no inverse)
    t.fill_(std::fmin(std::fmax(mean, a), b));
    return t;
  }
  // u uniform on [cdf(a), cdf(b)], mapped back through the inverse normal CDF
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = cdf((a - mean) / std), hi = cdf((b - mean) / std);
  Tensor u = rand(t.shape(), kFloat64, gen);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  const double* pu = static_cast<const double*>(u.data());
  for (size_t i = 0; i < v.size(); ++i) {
    double p = lo + (hi - lo) * pu[i];
    double x = mean + std * std::sqrt(2.0) * erfinv(2.0 * p - 1.0);
    v[i] = std::fmin(std::fmax(x, a), b);
  }
  assign(t, v);
  return t;
}

Tensor& constant_(Tensor& t, double value) {
  check_param(t, "constant_");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  check_param(t, "xavier_uniform_");
  Fans f = calculate_fan_in_and_fan_out(t);
  const double a = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return init::uniform_(t, -a, a, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  check_param(t, "xavier_normal_");
  Fans f = calculate_fan_in_and_fan_out(t);
  return init::normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)), gen);
}

Tensor& kaiming_uniform_(Tensor& t, double a, std::string_view mode, std::string_view nonlinearity, Generator* gen) {
  check_param(t, "kaiming_uniform_");
  const int64_t fan = fan_for(t, mode, "kaiming_uniform_");
  STRATA_CHECK(fan > 0, "[kaiming_uniform_] cannot initialize a tensor with a zero fan (shape {})", t.shape());
  const double bound = std::sqrt(3.0) * calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, std::string_view mode, std::string_view nonlinearity, Generator* gen) {
  check_param(t, "kaiming_normal_");
  const int64_t fan = fan_for(t, mode, "kaiming_normal_");
  STRATA_CHECK(fan > 0, "[kaiming_normal_] cannot initialize a tensor with a zero fan (shape {})", t.shape());
  return init::normal_(t, 0, calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan)), gen);
}

Tensor& orthogonal_(Tensor& t, double gain, Generator* gen) {
  check_param(t, "orthogonal_");
  STRATA_CHECK(t.dim() >= 2, "[orthogonal_] needs a tensor of at least 2 dims, got shape {}", t.shape());
  NoGradGuard no_grad;
  if (t.numel() == 0) return t;
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  // orthonormalize the columns of a tall (m, n) normal matrix A (A = flat or its transpose)
  const bool tall = rows >= cols;
  const int64_t m = tall ? rows : cols, n = tall ? cols : rows;
  Tensor a = randn({rows, cols}, kFloat64, gen);
  const double* pa = static_cast<const double*>(a.data());
  std::vector<double> q(static_cast<size_t>(m * n));  // column-major: q[j * m + i]
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) q[tall ? j * m + i : i * m + j] = pa[i * cols + j];
  // modified Gram-Schmidt with one re-orthogonalization pass; R's diagonal is positive, which
  // is the sign convention PyTorch applies to its QR
  for (int64_t j = 0; j < n; ++j) {
    double* qj = q.data() + j * m;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        const double* qk = q.data() + k * m;
        double r = 0;
        for (int64_t i = 0; i < m; ++i) r += qk[i] * qj[i];
        for (int64_t i = 0; i < m; ++i) qj[i] -= r * qk[i];
      }
    double norm = 0;
    for (int64_t i = 0; i < m; ++i) norm += qj[i] * qj[i];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < m; ++i) qj[i] /= norm;
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = gain * q[tall ? j * m + i : i * m + j];
  assign(t, out);
  return t;
}

}  // namespace strata::nn::init
