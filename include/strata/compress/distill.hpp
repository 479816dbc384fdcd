// Knowledge distillation: Hinton et al. 2015's soft-target loss, feature (hint) losses with an
// optional learned adapter, and a Distiller that runs a frozen teacher beside a student.
//
//   compress::Distiller kd(teacher, student, {.temperature = 4, .alpha = 0.9});
//   Tensor loss = kd.loss(images, labels);  // teacher in eval mode, under no_grad
//   loss.backward();
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/core/tensor.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/module.hpp>

namespace strata::compress {

struct DistillationOptions {
  double temperature = 4.0;  // > 0: both distributions are softmax(logits / T)
  double alpha = 0.9;        // in [0, 1]: the weight of the soft term; (1 - alpha) weighs cross entropy
  /// "batchmean" (the mean over samples: kl_div's batchmean with cross_entropy's mean), "sum",
  /// or "none" (one loss per sample and position: the KL summed over classes).
  std::string reduction = "batchmean";
  /// The hard term's options (class weights, ignore_index, label smoothing); its reduction is
  /// set from `reduction`.
  nn::functional::CrossEntropyOptions cross_entropy = {};
};

/// alpha T^2 KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) cross_entropy(student,
/// target), the second term only when `target` is defined (class indices or probabilities, as
/// cross_entropy takes). Logits are (N, C) or (N, C, d1, ...), classes along dim 1; the teacher
/// gets no gradient (it is detached). Computed from log_softmax of both, so large logits stay
/// finite. "batchmean" divides the KL sum by N, as torch's kl_div(reduction="batchmean").
///
/// Note [Distilling ignored targets]: positions whose class-index target equals
/// cross_entropy.ignore_index (padding) are left out of the soft term as well as the hard one:
/// "none" gives 0 there, "sum" sums the kept positions, and "batchmean" divides the kept KL sum
/// by the number of samples the kept positions make up (kept positions / positions per sample,
/// so N when nothing is ignored, and the kept count for (N, C) logits, as flattening the kept
/// positions and taking kl_div's batchmean would).
STRATA_API Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits,
                                    const DistillationOptions& options = {}, const Tensor& target = Tensor());

enum class FeatureLoss { MSE, Cosine };

/// The distance between a student feature and a teacher feature of the same shape (the teacher
/// detached): MSE averages the squared differences; Cosine averages 1 - cos over the vectors
/// along `channel_dim` (FitNets' hints, Romero et al. 2015, use MSE).
STRATA_API Tensor feature_distillation_loss(const Tensor& student_feature, const Tensor& teacher_feature,
                                            FeatureLoss kind = FeatureLoss::MSE, int64_t channel_dim = 1);

/// A learned linear map from the student's feature width to the teacher's, along
/// `channel_dim` (1: (N, C) vectors or (N, C, H, W) maps, where it is a 1x1 convolution; -1:
/// (B, T, C) sequences). Its parameters train with the student's.
class STRATA_API FeatureAdapter : public nn::Module {
 public:
  FeatureAdapter(int64_t student_width, int64_t teacher_width, int64_t channel_dim = 1,
                 nn::LinearOptions options = {});
  Tensor forward(const Tensor& student_feature) override;
  std::string name() const override { return "FeatureAdapter"; }

  nn::Linear proj;
  int64_t channel_dim;
};

/// The last output of one submodule of a model, kept by a forward hook, so intermediate
/// features can be distilled without changing the model's forward:
///
///   compress::FeatureCapture t_feat(teacher, "layer2"), s_feat(student, "layer2");
///   Tensor loss = kd.loss(x, y) + beta * feature_distillation_loss(adapter(s_feat.output()), t_feat.output());
///
/// The output keeps its graph (a student's feature trains the student); it is held until the
/// next call of the submodule, clear() or destruction. Destroying the capture removes its hook
/// (the model may be gone by then).
class STRATA_API FeatureCapture {
 public:
  /// `submodule` is a dotted name from `model` as named_modules() gives it ("" for the model).
  FeatureCapture(nn::Module& model, const std::string& submodule);
  ~FeatureCapture() { handle_.remove(); }
  FeatureCapture(FeatureCapture&&) noexcept = default;
  FeatureCapture& operator=(FeatureCapture&&) = delete;
  FeatureCapture(const FeatureCapture&) = delete;
  FeatureCapture& operator=(const FeatureCapture&) = delete;

  /// The submodule's output from its last call; raises Error when it has not run since the
  /// capture was made or cleared.
  const Tensor& output() const;
  bool has_output() const { return last_->defined(); }
  /// Drops the kept output (and the graph it holds).
  void clear() { *last_ = Tensor(); }
  const std::string& submodule() const { return submodule_; }

 private:
  std::string submodule_;
  std::shared_ptr<Tensor> last_ = std::make_shared<Tensor>();  // shared with the hook
  nn::RemovableHandle handle_;
};

/// Runs the teacher in eval mode under no_grad and the student as it is (train mode as set),
/// and combines their logits with distillation_loss. Works with any modules whose one-input
/// forward returns logits; the teacher and student are referenced, not owned.
class STRATA_API Distiller {
 public:
  Distiller(nn::Module& teacher, nn::Module& student, DistillationOptions options = {});

  struct Output {
    Tensor loss;
    Tensor student_logits;  // with the student's graph, for more loss terms or metrics
    Tensor teacher_logits;  // without a graph
  };
  /// Both forwards and the combined loss for one batch; `target` as distillation_loss's.
  Output forward(const Tensor& input, const Tensor& target = Tensor());
  Tensor loss(const Tensor& input, const Tensor& target = Tensor()) { return forward(input, target).loss; }

  DistillationOptions options;

 private:
  nn::Module* teacher_;
  nn::Module* student_;
};

}  // namespace strata::compress
