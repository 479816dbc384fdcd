// The losses and distances composed of strata ops (binary_cross_entropy, huber, soft margin,
// margin ranking, hinge and cosine embedding, triplet margin, Poisson and Gaussian NLL,
// multi-label soft margin; cosine_similarity, pairwise_distance, normalize) on a GPU against
// the CPU in float32, for every reduction: the values and the gradients of every input, on fresh
// random inputs. Skipped without a GPU.
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::Shape;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;

namespace {

using Inputs = const std::vector<Tensor>&;

struct Case {
  std::string name;
  std::vector<Tensor> inputs;  // on the CPU, float32
  size_t differentiable;       // the first inputs get gradients, the rest (labels) do not
  std::function<Tensor(Inputs, const std::string&)> loss;
};

Tensor uniform(const Shape& shape, double lo, double hi) { return random(shape, st::kFloat32, lo, hi); }

// Labels of 1 or -1.
Tensor labels(const Shape& shape) { return (random(shape, st::kFloat32) > 0).to(st::kFloat32) * 2 - 1; }

// The loss and the gradients of the differentiable inputs, from an upstream gradient `up`.
std::vector<Tensor> run(const Case& c, const std::string& reduction, bool on_gpu, const Tensor& up) {
  std::vector<Tensor> in;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    Tensor t = (on_gpu ? gpu(c.inputs[k]) : c.inputs[k]).detach();
    in.push_back(k < c.differentiable ? t.requires_grad_() : t);
  }
  Tensor y = c.loss(in, reduction);
  y.backward(on_gpu ? gpu(up) : up);
  std::vector<Tensor> out = {y.detach()};
  for (size_t k = 0; k < c.differentiable; ++k) out.push_back(in[k].grad());
  return out;
}

}  // namespace

TEST(CudaLosses, ExtraLossesMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const int64_t n = 37, d = 19;
  const Shape nd = {n, d};
  const std::vector<Case> cases = {
      {"binary_cross_entropy", {uniform(nd, 0.02, 0.98), uniform(nd, 0, 1), uniform({d}, 0.5, 1.5)}, 3,
       [](Inputs t, const std::string& r) { return F::binary_cross_entropy(t[0], t[1], {t[2], r}); }},
      {"binary_cross_entropy at 0 and 1",
       {st::from_vector<float>({0, 1, 0.5f, 1e-30f, 1, 0}), st::from_vector<float>({1, 0, 0.25f, 1, 1, 0})}, 2,
       [](Inputs t, const std::string& r) { return F::binary_cross_entropy(t[0], t[1], {.reduction = r}); }},
      {"huber_loss", {uniform(nd, -3, 3), uniform(nd, -3, 3)}, 2,
       [](Inputs t, const std::string& r) { return F::huber_loss(t[0], t[1], r, 1.3); }},
      {"soft_margin_loss", {uniform(nd, -3, 3), labels(nd)}, 1,
       [](Inputs t, const std::string& r) { return F::soft_margin_loss(t[0], t[1], r); }},
      {"margin_ranking_loss", {uniform(nd, -2, 2), uniform(nd, -2, 2), labels(nd)}, 2,
       [](Inputs t, const std::string& r) { return F::margin_ranking_loss(t[0], t[1], t[2], 0.2, r); }},
      {"hinge_embedding_loss", {uniform(nd, 0, 2), labels(nd)}, 1,
       [](Inputs t, const std::string& r) { return F::hinge_embedding_loss(t[0], t[1], 1.0, r); }},
      {"cosine_embedding_loss", {uniform(nd, -1, 1), uniform(nd, -1, 1), labels({n})}, 2,
       [](Inputs t, const std::string& r) { return F::cosine_embedding_loss(t[0], t[1], t[2], 0.1, r); }},
      {"triplet_margin_loss p=2 swap", {uniform(nd, -1, 1), uniform(nd, -1, 1), uniform(nd, -1, 1)}, 3,
       [](Inputs t, const std::string& r) {
         return F::triplet_margin_loss(t[0], t[1], t[2], {.margin = 2, .swap = true, .reduction = r});
       }},
      {"triplet_margin_loss p=1", {uniform(nd, -1, 1), uniform(nd, -1, 1), uniform(nd, -1, 1)}, 3,
       [](Inputs t, const std::string& r) {
         return F::triplet_margin_loss(t[0], t[1], t[2], {.margin = 3, .p = 1, .reduction = r});
       }},
      {"poisson_nll_loss full", {uniform(nd, -2, 2), uniform(nd, 0, 5)}, 2,
       [](Inputs t, const std::string& r) { return F::poisson_nll_loss(t[0], t[1], {.full = true, .reduction = r}); }},
      {"poisson_nll_loss rate", {uniform(nd, 0.1, 3), uniform(nd, 0, 5)}, 2,
       [](Inputs t, const std::string& r) {
         return F::poisson_nll_loss(t[0], t[1], {.log_input = false, .reduction = r});
       }},
      {"gaussian_nll_loss", {uniform(nd, -2, 2), uniform(nd, -2, 2), uniform({n, 1}, 0.05, 2)}, 3,
       [](Inputs t, const std::string& r) {
         return F::gaussian_nll_loss(t[0], t[1], t[2], {.full = true, .reduction = r});
       }},
      {"multilabel_soft_margin_loss", {uniform(nd, -3, 3), uniform(nd, 0, 1), uniform({d}, 0.5, 1.5)}, 3,
       [](Inputs t, const std::string& r) { return F::multilabel_soft_margin_loss(t[0], t[1], {t[2], r}); }},
      {"cosine_similarity", {uniform(nd, -1, 1), uniform({1, d}, -1, 1)}, 2,
       [](Inputs t, const std::string&) { return F::cosine_similarity(t[0], t[1]); }},
      {"pairwise_distance", {uniform(nd, -1, 1), uniform(nd, -1, 1)}, 2,
       [](Inputs t, const std::string&) { return F::pairwise_distance(t[0], t[1], 3, 1e-6, true); }},
      {"normalize", {uniform(nd, -1, 1)}, 1, [](Inputs t, const std::string&) { return F::normalize(t[0]); }},
  };
  for (const Case& c : cases)
    for (const std::string reduction : {"none", "mean", "sum"}) {
      const std::string what = c.name + " " + reduction;
      const Tensor shape_probe = c.loss(c.inputs, reduction);
      const Tensor up = uniform(shape_probe.shape(), -1, 1);
      const std::vector<Tensor> cpu = run(c, reduction, false, up), cuda = run(c, reduction, true, up);
      for (size_t k = 0; k < cpu.size(); ++k)
        st::cuda_testing::expect_close(cpu[k], cuda[k], what + (k == 0 ? " value" : " grad " + std::to_string(k - 1)),
                                       3e-5, 1e-6);
    }
}
