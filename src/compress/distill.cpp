// Knowledge distillation: see include/strata/compress/distill.hpp. The soft term is
// nn::functional::kl_div on log_softmax outputs with log_target, so it shares that loss's
// checks and stays finite for large logits (exp of a log-probability never overflows).
#include <strata/compress/distill.hpp>

#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::compress {

namespace F = nn::functional;

namespace {

// (1 - alpha) cross_entropy(student, target), reduced as distillation_loss's `reduction` says.
Tensor hard_term(const Tensor& student_logits, const Tensor& target, const DistillationOptions& options) {
  F::CrossEntropyOptions ce = options.cross_entropy;
  ce.reduction = options.reduction == "batchmean" ? "mean" : options.reduction;
  return F::cross_entropy(student_logits, target, ce) * (1 - options.alpha);
}

}  // namespace

Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits, const DistillationOptions& options,
                         const Tensor& target) {
  STRATA_CHECK(student_logits.defined() && teacher_logits.defined(),
               "[distillation_loss] student or teacher logits are undefined");
  STRATA_CHECK(student_logits.dim() >= 2, "[distillation_loss] logits must be (N, C) or (N, C, d1, ...), got shape {}",
               student_logits.shape());
  STRATA_CHECK(student_logits.shape() == teacher_logits.shape(),
               "[distillation_loss] student logits of shape {} and teacher logits of shape {} must have the same shape",
               student_logits.shape(), teacher_logits.shape());
  STRATA_CHECK(std::isfinite(options.temperature) && options.temperature > 0,
               "[distillation_loss] temperature must be > 0, got {}", options.temperature);
  STRATA_CHECK(options.alpha >= 0 && options.alpha <= 1, "[distillation_loss] alpha must be in [0, 1], got {}",
               options.alpha);
  const std::string& r = options.reduction;
  STRATA_CHECK(r == "batchmean" || r == "sum" || r == "none",
               "[distillation_loss] reduction must be \"batchmean\", \"sum\" or \"none\", got \"{}\" (kl_div's "
               "\"mean\" averages over classes too, which is not the KL divergence)",
               r);
  const double t = options.temperature;
  const Tensor log_p_student = F::log_softmax(student_logits / t, 1);
  const Tensor log_p_teacher = F::log_softmax(teacher_logits.detach().to(student_logits.dtype()) / t, 1);
  const double soft_weight = options.alpha * t * t;
  const bool class_indices = target.defined() && !is_floating(target.dtype());
  if (!class_indices) {
    Tensor kl = r == "none" ? F::kl_div(log_p_student, log_p_teacher, "none", true).sum({1})
                            : F::kl_div(log_p_student, log_p_teacher, r, true);
    if (!target.defined()) return kl * soft_weight;
    return kl * soft_weight + hard_term(student_logits, target, options);
  }
  // Positions whose target is ignore_index (padding) are left out of the soft term too; a
  // sample counts for the share of its positions that are kept (Note [Distilling ignored targets])
  const Tensor hard = hard_term(student_logits, target, options);  // checks the target's shape
  const Tensor kept = ne(target, Scalar(options.cross_entropy.ignore_index)).to(log_p_student.dtype());
  const Tensor kl = F::kl_div(log_p_student, log_p_teacher, "none", true).sum({1}) * kept;
  if (r == "none") return kl * soft_weight + hard;
  if (r == "sum") return kl.sum() * soft_weight + hard;
  const double positions_per_sample = static_cast<double>(kl.numel()) / static_cast<double>(kl.size(0));
  return kl.sum() / (kept.sum() / positions_per_sample) * soft_weight + hard;
}

Tensor feature_distillation_loss(const Tensor& student_feature, const Tensor& teacher_feature, FeatureLoss kind,
                                 int64_t channel_dim) {
  STRATA_CHECK(student_feature.defined() && teacher_feature.defined(),
               "[feature_distillation_loss] student or teacher feature is undefined");
  STRATA_CHECK(student_feature.shape() == teacher_feature.shape(),
               "[feature_distillation_loss] student feature of shape {} and teacher feature of shape {} differ: map "
               "the student's with a FeatureAdapter",
               student_feature.shape(), teacher_feature.shape());
  const Tensor teacher = teacher_feature.detach().to(student_feature.dtype());
  if (kind == FeatureLoss::MSE) return F::mse_loss(student_feature, teacher);
  STRATA_CHECK(channel_dim >= -student_feature.dim() && channel_dim < student_feature.dim(),
               "[feature_distillation_loss] channel_dim {} does not exist in features of shape {}", channel_dim,
               student_feature.shape());
  return mean(1.0 - F::cosine_similarity(student_feature, teacher, channel_dim));
}

FeatureAdapter::FeatureAdapter(int64_t student_width, int64_t teacher_width, int64_t channel_dim,
                               nn::LinearOptions options)
    : proj(student_width, teacher_width, options), channel_dim(channel_dim) {
  register_module("proj", proj);
}

Tensor FeatureAdapter::forward(const Tensor& student_feature) {
  const int64_t n = student_feature.dim();
  STRATA_CHECK(channel_dim >= -n && channel_dim < n, "[FeatureAdapter] channel_dim {} does not exist in a feature of "
               "shape {}", channel_dim, student_feature.shape());
  const int64_t d = channel_dim < 0 ? channel_dim + n : channel_dim;
  STRATA_CHECK(student_feature.size(d) == proj.in_features,
               "[FeatureAdapter] expected {} channels along dim {} of the student feature, got shape {}",
               proj.in_features, d, student_feature.shape());
  if (d == n - 1) return proj(student_feature);
  // a linear map on the channels at every other position: move them last and back
  return proj(student_feature.transpose(d, n - 1)).transpose(d, n - 1);
}

Distiller::Distiller(nn::Module& teacher, nn::Module& student, DistillationOptions options)
    : options(std::move(options)), teacher_(&teacher), student_(&student) {
  STRATA_CHECK(&teacher != &student, "[Distiller] the teacher and the student must be different modules");
  teacher.eval();
}

Distiller::Output Distiller::forward(const Tensor& input, const Tensor& target) {
  Output out;
  {
    NoGradGuard no_grad;
    if (teacher_->is_training()) teacher_->eval();  // a caller's model.train() may have reached it
    out.teacher_logits = (*teacher_)(input);
  }
  out.student_logits = (*student_)(input);
  out.loss = distillation_loss(out.student_logits, out.teacher_logits, options, target);
  return out;
}

FeatureCapture::FeatureCapture(nn::Module& model, const std::string& submodule) : submodule_(submodule) {
  nn::Module* target = nullptr;
  for (auto& [name, m] : model.named_modules())
    if (name == submodule) target = m;
  STRATA_CHECK(target != nullptr, "[FeatureCapture] {} has no submodule named \"{}\"", model.name(), submodule);
  handle_ = target->register_forward_hook(
      [last = last_](nn::Module&, const Tensor&, const Tensor& output) { *last = output; });
}

const Tensor& FeatureCapture::output() const {
  STRATA_CHECK(last_->defined(), "[FeatureCapture] \"{}\" has not run since the capture was made or cleared",
               submodule_);
  return *last_;
}

}  // namespace strata::compress
