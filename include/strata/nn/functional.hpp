// nn::functional: the stateless functions behind the layers (linear, embedding, dropout,
// normalization, activations, attention) and the losses. Names and argument order follow
// torch.nn.functional; optional arguments of the losses come in options structs that read
// well with designated initializers:
//
//   auto loss = F::cross_entropy(logits, target, {.ignore_index = 0, .label_smoothing = 0.1});
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>
#include <strata/nn/functional_conv.hpp>      // convolution, pooling, batch norm
#include <strata/nn/functional_resample.hpp>  // pad, interpolate

namespace strata::nn {

/// Parameters of the layer_norm and layer_norm_backward kernels: normalize each row of a
/// contiguous (rows, n) array; rms skips the mean (RMSNorm).
struct LayerNormParams {
  double eps = 1e-5;
  bool rms = false;
};

/// Parameters of the cross_entropy_fused kernels over logits (N, C), int64 class indices (N)
/// and class weights (C) or undefined: targets equal to ignore_index add nothing,
/// label_smoothing is the share of each target spread over all classes, total_weight the sum
/// of the class weights (unused without them).
struct CrossEntropyParams {
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  double total_weight = 0;
};

/// How EmbeddingBag reduces each bag.
enum class EmbeddingBagMode : uint8_t { Sum, Mean, Max };

/// Parameters of the dropout kernel: drop probability and the Philox draw.
struct DropoutParams {
  double p = 0.5;
  uint64_t seed = 0;
  uint64_t offset = 0;
  Generator* generator = nullptr;  // where the draw came from (a CUDA graph redraws per replay)
};

}  // namespace strata::nn

namespace strata::nn::functional {

// ---- linear layers ---------------------------------------------------------------------------

/// x @ weight^T + bias for x of shape (*, in), weight (out, in), bias (out) or undefined.
STRATA_API Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// The rows of weight (num_embeddings, dim) picked by int64/int32 indices of any shape: the
/// result has shape indices.shape + (dim). Every index is checked. The row padding_idx
/// (negative counts from the end) gets no gradient.
STRATA_API Tensor embedding(const Tensor& indices, const Tensor& weight,
                            std::optional<int64_t> padding_idx = std::nullopt);
/// Zeroes each element with probability p and scales the rest by 1 / (1 - p), in training
/// only; p in [0, 1]. The mask is drawn from gen (default_generator() when null).
STRATA_API Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
struct EmbeddingBagArgs {
  Tensor offsets;             // 1-d indices: where each bag starts (int64/int32, ascending from 0)
  EmbeddingBagMode mode = EmbeddingBagMode::Mean;
  Tensor per_sample_weights;  // of the indices' shape, Sum only
  bool include_last_offset = false;
  std::optional<int64_t> padding_idx;
};

/// The rows of weight picked by each bag of indices, reduced: torch.nn.functional.embedding_bag.
/// indices (B, N) are B bags of N, or 1-d with args.offsets; an empty bag gives zeros. -> (B, dim)
STRATA_API Tensor embedding_bag(const Tensor& indices, const Tensor& weight, const EmbeddingBagArgs& args = {});
/// Channel dropout: whole channels of (N, C, L) or (C, L) (dropout1d) and of (N, C, H, W) or
/// (C, H, W) (dropout2d) are zeroed with probability p, the rest scaled by 1 / (1 - p).
STRATA_API Tensor dropout1d(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
STRATA_API Tensor dropout2d(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);

// ---- normalization ---------------------------------------------------------------------------

/// Normalizes over the trailing dims given by normalized_shape, then applies the optional
/// elementwise weight and bias (both of normalized_shape).
STRATA_API Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                             const Tensor& bias = Tensor(), double eps = 1e-5);
/// x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps defaults to the machine
/// epsilon of the type it is computed in, as in PyTorch: double's for float64, else float's
/// (float16 and bfloat16 are computed in float).
STRATA_API Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                           std::optional<double> eps = std::nullopt);
/// Normalizes (N, C, *) over groups of C / num_groups channels (and all of *), then applies
/// the optional per-channel weight and bias (C).
STRATA_API Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(),
                             const Tensor& bias = Tensor(), double eps = 1e-5);

// ---- activations -------------------------------------------------------------------------------

STRATA_API Tensor relu(const Tensor& x);
/// approximate: "none" (exact, erf) or "tanh".
STRATA_API Tensor gelu(const Tensor& x, std::string_view approximate = "none");
STRATA_API Tensor silu(const Tensor& x);
STRATA_API Tensor tanh(const Tensor& x);
STRATA_API Tensor sigmoid(const Tensor& x);
STRATA_API Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
STRATA_API Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
STRATA_API Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

// Composed of elementwise ops with kernels on both devices (src/nn/activations.cpp),
// with torch.nn.functional's formulas and its gradients at the kinks; floating inputs only.
/// x for x > 0, alpha (e^x - 1) otherwise.
STRATA_API Tensor elu(const Tensor& x, double alpha = 1.0);
/// scale * elu(x, alpha) with the self-normalizing constants.
STRATA_API Tensor selu(const Tensor& x);
/// max(0, x) + min(0, alpha (e^(x / alpha) - 1)); alpha nonzero.
STRATA_API Tensor celu(const Tensor& x, double alpha = 1.0);
/// log(1 + e^(beta x)) / beta, and x itself where beta x > threshold; beta nonzero.
STRATA_API Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// x tanh(softplus(x)).
STRATA_API Tensor mish(const Tensor& x);
/// log(sigmoid(x)), without overflow for large |x|.
STRATA_API Tensor logsigmoid(const Tensor& x);
/// x clamped to [min_val, max_val], with a zero gradient at and past the bounds (as PyTorch).
STRATA_API Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
/// hardtanh(x, 0, 6).
STRATA_API Tensor relu6(const Tensor& x);
/// relu6(x + 3) / 6.
STRATA_API Tensor hardsigmoid(const Tensor& x);
/// x relu6(x + 3) / 6.
STRATA_API Tensor hardswish(const Tensor& x);
/// x / (1 + |x|).
STRATA_API Tensor softsign(const Tensor& x);
/// a * sigmoid(b) for the two halves a, b of x along dim (of even size).
STRATA_API Tensor glu(const Tensor& x, int64_t dim = -1);
/// x for x >= 0, weight * x otherwise; weight has 1 element or one per channel (dim 1 of x).
STRATA_API Tensor prelu(const Tensor& x, const Tensor& weight);

// ---- attention ---------------------------------------------------------------------------------

/// softmax(q @ k^T * scale + mask) @ v for q (..., L, E), k (..., S, E), v (..., S, Ev); the
/// leading dims broadcast. attn_mask broadcasts to (..., L, S): a bool mask is true where a
/// query may attend, a float mask is added to the scores. is_causal masks keys after the
/// query (j > i). scale defaults to 1 / sqrt(E). dropout_p drops attention weights (with gen).
/// A query whose keys are all masked gets NaN, as PyTorch's reference implementation does.
STRATA_API Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& attn_mask = Tensor(), double dropout_p = 0,
                                               bool is_causal = false, std::optional<double> scale = std::nullopt,
                                               Generator* gen = nullptr);

/// Whether scaled_dot_product_attention (and MultiheadAttention) may run the fused attention
/// kernels on tensors of `device`: one op that never writes the (L, S) scores, used when there
/// is no mask but is_causal (dropout drops the weights functional::dropout would with the same
/// generator), and q, k and v share dtype and device and their batch dims broadcast.
/// On by default on the CPU; off on CUDA, whose kernels have not yet run on a GPU. Like
/// PyTorch's torch.backends.cuda.enable_flash_sdp; the switch is process-wide.
STRATA_API void set_fused_attention(DeviceType device, bool enabled);
STRATA_API bool fused_attention_enabled(DeviceType device);

/// set_fused_attention(device, enabled) for the guard's lifetime; the previous setting comes
/// back when it ends, however the scope is left.
class FusedAttentionGuard {
 public:
  FusedAttentionGuard(DeviceType device, bool enabled) : device_(device), previous_(fused_attention_enabled(device)) {
    set_fused_attention(device, enabled);
  }
  ~FusedAttentionGuard() { set_fused_attention(device_, previous_); }
  FusedAttentionGuard(const FusedAttentionGuard&) = delete;
  FusedAttentionGuard& operator=(const FusedAttentionGuard&) = delete;

 private:
  DeviceType device_;
  bool previous_;
};

// ---- losses ------------------------------------------------------------------------------------
// reduction is "mean", "sum" or "none". Inputs and targets of the elementwise losses must
// have the same shape (no silent broadcasting).

struct CrossEntropyOptions {
  Tensor weight;                   // (C) per-class weight, or undefined
  int64_t ignore_index = -100;     // class-index targets equal to this add nothing (any value)
  std::string reduction = "mean";
  double label_smoothing = 0;      // in [0, 1]
};

/// Cross entropy of logits (N, C) or (N, C, d1, ...) (or unbatched (C)) against class indices
/// (N) / (N, d1, ...) (int64 or int32) or class probabilities of the logits' shape (floating).
/// Computed from log_softmax. "mean" over class indices divides by the summed weights of the
/// targets that are not ignored (NaN when that sum is 0, with a gradient of 0); over
/// probabilities by the number of samples. An index outside [0, C) that is not ignore_index
/// raises Error naming it. Probability targets take no ignore_index (one >= 0 raises).
STRATA_API Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options = {});

struct NLLLossOptions {
  Tensor weight;
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};

/// Negative log likelihood of log-probabilities (N, C) / (N, C, d1, ...) at class indices;
/// "mean" as cross_entropy's.
STRATA_API Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {});

STRATA_API Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
STRATA_API Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
/// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0 is the L1 loss).
STRATA_API Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean",
                                 double beta = 1.0);

struct BCEWithLogitsOptions {
  Tensor weight;      // broadcasts to the input
  Tensor pos_weight;  // weight of positive examples, broadcasting along the last dim (C)
  std::string reduction = "mean";
};

/// -w [pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], computed without overflow.
STRATA_API Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                                   const BCEWithLogitsOptions& options = {});

/// KL divergence with input as log-probabilities: target * (log target - input), or
/// exp(target) * (target - input) when log_target. reduction may also be "batchmean" (the
/// sum divided by the first dim's size).
STRATA_API Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction = "mean",
                         bool log_target = false);

// The losses below (src/nn/loss_extra.cpp) convert targets, labels and weights of any number
// dtype but bool to the input's dtype. Labels of 1 and -1 are not checked, as in PyTorch.

struct BCEOptions {
  Tensor weight;  // broadcasts to the input
  std::string reduction = "mean";
};

/// -w [y log(x) + (1 - y) log(1 - x)] for probabilities x and targets y in [0, 1] (others raise
/// Error), each log clamped at -100 as in PyTorch, so x = 0 or 1 gives a finite loss. The
/// gradient is this formula's: 0 through a clamped log, where PyTorch divides by
/// max(x (1 - x), 1e-12) instead.
STRATA_API Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCEOptions& options = {});

/// 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target; delta > 0.
STRATA_API Tensor huber_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean",
                             double delta = 1.0);

/// log(1 + exp(-y x)) for labels y of 1 or -1, without overflow.
STRATA_API Tensor soft_margin_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");

/// max(0, -y (x1 - x2) + margin) for labels y of 1 (x1 should rank higher) or -1; x1, x2 and y
/// of one shape.
STRATA_API Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                                      double margin = 0, std::string_view reduction = "mean");

/// x where y = 1, max(0, margin - x) where y = -1 (both terms for any other label), for
/// distances x.
STRATA_API Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, double margin = 1.0,
                                       std::string_view reduction = "mean");

/// 1 - cos(x1, x2) where y = 1, max(0, cos(x1, x2) - margin) where y = -1, 0 for other labels;
/// x1 and x2 of shape (N, D) with y (N), or (D) with a 0-d y. As in PyTorch, cos is
/// <x1, x2> / sqrt((|x1|^2 + 1e-12) (|x2|^2 + 1e-12)), not cosine_similarity.
STRATA_API Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                                        double margin = 0, std::string_view reduction = "mean");

struct TripletMarginLossOptions {
  double margin = 1.0;
  double p = 2;       // the norm of the distances
  double eps = 1e-6;  // added to the differences, as pairwise_distance
  bool swap = false;  // take min(d(a, n), d(p, n)) as the negative's distance
  std::string reduction = "mean";
};

/// max(0, margin + d(a, p) - d(a, n)) with d = pairwise_distance over the last dim, for anchor,
/// positive and negative of one shape ((N, D) or (D)).
STRATA_API Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                                      const TripletMarginLossOptions& options = {});

struct PoissonNLLLossOptions {
  bool log_input = true;  // the input is log(rate), else the rate
  bool full = false;      // add Stirling's approximation of log(y!) where y > 1
  double eps = 1e-8;      // added to the rate before its log when !log_input
  std::string reduction = "mean";
};

/// exp(x) - y x when log_input, else x - y log(x + eps); full adds y log y - y + 0.5 log(2 pi y)
/// where y > 1.
STRATA_API Tensor poisson_nll_loss(const Tensor& input, const Tensor& target,
                                   const PoissonNLLLossOptions& options = {});

struct GaussianNLLLossOptions {
  bool full = false;  // add 0.5 log(2 pi)
  double eps = 1e-6;  // the least variance
  std::string reduction = "mean";
};

/// 0.5 (log v + (x - y)^2 / v) [+ 0.5 log(2 pi)] with v = max(var, eps), whose gradient passes to
/// var unchanged (PyTorch clamps under no_grad). var (non-negative, else Error) has the input's
/// shape, or one variance per row of the last dim: that shape without its last dim or with a
/// last dim of 1. The target has the input's shape or broadcasts to it.
STRATA_API Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                                    const GaussianNLLLossOptions& options = {});

struct MultiLabelSoftMarginLossOptions {
  Tensor weight;  // (C) per-class weight, broadcasting to the input
  std::string reduction = "mean";
};

/// -w [y log sigmoid(x) + (1 - y) log sigmoid(-x)] averaged over the classes, for input and
/// target of shape (N, C) or (C): one loss per sample, (N) or (), before the reduction.
STRATA_API Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target,
                                              const MultiLabelSoftMarginLossOptions& options = {});

// ---- distances (src/nn/distance.cpp) -----------------------------------------------------------

/// sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) along dim, the norms clamped as in PyTorch
/// (the gradient passes to them unchanged). x1 and x2 broadcast; the result drops dim.
STRATA_API Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim = 1, double eps = 1e-8);
/// ||x1 - x2 + eps||_p over the last dim of x1 and x2 (broadcast); eps is added to each
/// difference, as in PyTorch.
STRATA_API Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2, double eps = 1e-6,
                                    bool keepdim = false);
/// x / max(||x||_p, eps) along dim.
STRATA_API Tensor normalize(const Tensor& x, double p = 2, int64_t dim = 1, double eps = 1e-12);

}  // namespace strata::nn::functional
