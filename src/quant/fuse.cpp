// Module fusion: see include/strata/quant/fuse.hpp.
#include <strata/quant/fuse.hpp>

#include <set>
#include <type_traits>
#include <utility>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/activation.hpp>
#include <strata/nn/basic.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/unary.hpp>

#include "quant/forms.h"
#include "quant/layer_ops.h"

namespace strata::quant {

namespace {

// w * s and (b - mean) * s + beta with s = gamma / sqrt(var + eps) per output channel (dim 0 of
// w), in w's dtype and on its device.
std::pair<Tensor, Tensor> fold_batch_norm(const nn::BatchNormBase& bn, const Tensor& w, const Tensor& b,
                                          int64_t out, const char* op) {
  STRATA_CHECK(w.defined(), "[{}] the layer's float weight was replaced by a quantized form", op);
  STRATA_CHECK(bn.num_features == out, "[{}] {} has {} features for a layer of {} output channels", op, bn.name(),
               bn.num_features, out);
  STRATA_CHECK(bn.running_mean.defined() && bn.running_var.defined(),
               "[{}] {} keeps no running statistics (track_running_stats=false) to fold", op, bn.name());
  NoGradGuard no_grad;
  const TensorOptions o(w.dtype(), w.device());
  const Tensor mean = bn.running_mean.detach().to(w.device(), w.dtype());
  const Tensor beta = bn.bias.defined() ? bn.bias.detach().to(w.device(), w.dtype()) : zeros({out}, o);
  const Tensor s = detail::bn_scale(bn, w);  // the scale QAT's forms apply (quant/layer_ops.h)
  const Tensor bias = b.defined() ? b.detach().to(w.device(), w.dtype()) : zeros({out}, o);
  return {(w.detach() * s.reshape(detail::per_channel_shape(w.dim(), 0, out))).contiguous(),
          ((bias - mean) * s + beta).contiguous()};
}

// the fresh layer's parameters take the folded values, in their dtype and device
template <class Layer>
std::unique_ptr<Layer> with_values(std::unique_ptr<Layer> layer, const Layer& from, std::pair<Tensor, Tensor> wb) {
  layer->to(wb.first.device(), wb.first.dtype());
  NoGradGuard no_grad;
  layer->weight.copy_(wb.first);
  layer->bias.copy_(wb.second);
  layer->train(from.is_training());
  return layer;
}

// A new convolution of conv's configuration, with a bias, holding conv followed by bn folded.
template <class Conv>
std::unique_ptr<Conv> fused_conv(const Conv& conv, const nn::BatchNormBase& bn) {
  // scaled along the output channels: dim 0 of the weight with them first (layer_ops.h's out_major)
  const Tensor w = conv.weight.defined() ? detail::out_major(conv, conv.weight.detach()) : conv.weight;
  auto wb = fold_batch_norm(bn, w, conv.bias, conv.out_channels, "fuse_conv_bn_eval");
  wb.first = detail::from_out_major(conv, wb.first).contiguous();
  auto o = conv.options;
  o.bias = true;
  Generator unused;  // the initial values are overwritten: the default generator's stream stays as it was
  o.generator = &unused;
  return with_values(std::make_unique<Conv>(conv.in_channels, conv.out_channels, conv.kernel_size, o), conv,
                     std::move(wb));
}

enum class Role { Conv, Conv1d, ConvTranspose2d, Linear, BatchNorm2d, BatchNorm1d, ReLU, Other };

Role role_of(nn::Module& m) {
  if (dynamic_cast<nn::Conv2d*>(&m)) return Role::Conv;
  if (dynamic_cast<nn::Conv1d*>(&m)) return Role::Conv1d;
  if (dynamic_cast<nn::ConvTranspose2d*>(&m)) return Role::ConvTranspose2d;
  if (dynamic_cast<nn::Linear*>(&m)) return Role::Linear;
  if (dynamic_cast<nn::BatchNorm2d*>(&m)) return Role::BatchNorm2d;
  if (dynamic_cast<nn::BatchNorm1d*>(&m)) return Role::BatchNorm1d;
  if (dynamic_cast<nn::ReLU*>(&m)) return Role::ReLU;
  return Role::Other;
}

// The fused kind of a run of roles, or Other's stand-in: whether the pattern is known.
bool pattern_of(const std::vector<Role>& r, FusedKind* kind) {
  using R = Role;
  const auto is = [&](std::initializer_list<Role> p) { return r == std::vector<Role>(p); };
  if (is({R::Conv, R::BatchNorm2d})) *kind = FusedKind::ConvBn2d;
  else if (is({R::Conv, R::BatchNorm2d, R::ReLU})) *kind = FusedKind::ConvBnReLU2d;
  else if (is({R::Conv, R::ReLU})) *kind = FusedKind::ConvReLU2d;
  else if (is({R::Conv1d, R::BatchNorm1d})) *kind = FusedKind::ConvBn1d;
  else if (is({R::Conv1d, R::BatchNorm1d, R::ReLU})) *kind = FusedKind::ConvBnReLU1d;
  else if (is({R::Conv1d, R::ReLU})) *kind = FusedKind::ConvReLU1d;
  else if (is({R::ConvTranspose2d, R::BatchNorm2d})) *kind = FusedKind::ConvTransposeBn2d;
  else if (is({R::Linear, R::ReLU})) *kind = FusedKind::LinearReLU;
  else if (is({R::Linear, R::BatchNorm1d})) *kind = FusedKind::LinearBn1d;
  else return false;
  return true;
}

// Whether a fused run's first layer (Conv2d, Conv1d, ConvTranspose2d or Linear) has a form, and its output channels.
std::pair<bool, int64_t> form_and_out_channels(nn::Module& m) {
  if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) return {c->form() != nullptr, c->out_channels};
  if (auto* c = dynamic_cast<nn::Conv1d*>(&m)) return {c->form() != nullptr, c->out_channels};
  if (auto* c = dynamic_cast<nn::ConvTranspose2d*>(&m)) return {c->form() != nullptr, c->out_channels};
  auto& l = static_cast<nn::Linear&>(m);
  return {l.form() != nullptr, l.out_features};
}

// The eval form of a fused run: batch norm folded into the layer (a plain layer when nothing else
// is left), or the fused module as it stands.
std::unique_ptr<nn::Module> fused_eval(FusedKind kind, std::vector<std::unique_ptr<nn::Module>> m) {
  const bool conv2d = kind == FusedKind::ConvBn2d || kind == FusedKind::ConvBnReLU2d;
  if (conv2d || kind == FusedKind::ConvBn1d || kind == FusedKind::ConvBnReLU1d) {
    if (conv2d) m[0] = fuse_conv_bn_eval(static_cast<nn::Conv2d&>(*m[0]), static_cast<nn::BatchNorm2d&>(*m[1]));
    else m[0] = fuse_conv_bn_eval(static_cast<nn::Conv1d&>(*m[0]), static_cast<nn::BatchNorm1d&>(*m[1]));
    if (kind == FusedKind::ConvBn2d || kind == FusedKind::ConvBn1d) return std::move(m[0]);
    std::vector<std::unique_ptr<nn::Module>> rest;
    rest.push_back(std::move(m[0]));
    rest.push_back(std::move(m[2]));
    return std::make_unique<FusedModule>(conv2d ? FusedKind::ConvReLU2d : FusedKind::ConvReLU1d, std::move(rest));
  }
  if (kind == FusedKind::ConvTransposeBn2d)
    return fuse_conv_bn_eval(static_cast<nn::ConvTranspose2d&>(*m[0]), static_cast<nn::BatchNorm2d&>(*m[1]));
  if (kind == FusedKind::LinearBn1d)
    return fuse_linear_bn_eval(static_cast<nn::Linear&>(*m[0]), static_cast<nn::BatchNorm1d&>(*m[1]));
  return std::make_unique<FusedModule>(kind, std::move(m));
}

void fuse(nn::Module& model, const std::vector<std::vector<std::string>>& groups, bool qat) {
  const char* op = qat ? "fuse_modules_qat" : "fuse_modules";
  std::vector<FusedKind> kinds;
  std::set<std::string> seen;
  for (const auto& names : groups) {  // every check before the first change
    STRATA_CHECK(names.size() == 2 || names.size() == 3, "[{}] a group names 2 or 3 modules, got {}", op,
                 names.size());
    std::vector<Role> roles;
    std::string types;
    for (const std::string& n : names) {
      STRATA_CHECK(seen.insert(n).second, "[{}] \"{}\" is named twice", op, n);
      nn::Module& m = model.get_submodule(n);
      STRATA_CHECK(model.owns_submodule(n), "[{}] \"{}\" ({}) is a data member of its parent and cannot be replaced "
                   "(Note [Member children]); hold the layers in an nn::Sequential or register them as "
                   "std::unique_ptr", op, n, m.name());
      roles.push_back(role_of(m));
      types += (types.empty() ? "" : ", ") + m.name();
    }
    FusedKind kind{};
    STRATA_CHECK(pattern_of(roles, &kind), "[{}] cannot fuse ({}): the patterns are Conv2d + BatchNorm2d (+ ReLU), "
                 "Conv2d + ReLU, Conv1d + BatchNorm1d (+ ReLU), Conv1d + ReLU, Linear + ReLU, Linear + "
                 "BatchNorm1d and ConvTranspose2d + BatchNorm2d", op, types);
    STRATA_CHECK(!qat || kind != FusedKind::ConvTransposeBn2d, "[{}] ConvTranspose2d + BatchNorm2d fuse in eval "
                 "only (fuse_modules folds the batch norm), as in PyTorch", op);
    nn::Module& first = model.get_submodule(names[0]);
    const auto [has_form, out] = form_and_out_channels(first);
    STRATA_CHECK(!has_form, "[{}] \"{}\" is quantized or prepared already", op, names[0]);
    if (roles[1] == Role::BatchNorm2d || roles[1] == Role::BatchNorm1d) {
      auto& bn = static_cast<nn::BatchNormBase&>(model.get_submodule(names[1]));
      const auto mode = [](const nn::Module& m) { return m.is_training() ? "training" : "eval"; };
      STRATA_CHECK(first.is_training() == bn.is_training(), "[{}] \"{}\" is in {} mode and \"{}\" in {} mode: a "
                   "layer and its batch norm fuse in one mode", op, names[0], mode(first), names[1], mode(bn));
      STRATA_CHECK(qat == bn.is_training(), "[{}] \"{}\" is in {} mode: {}", op, names[1],
                   bn.is_training() ? "training" : "eval",
                   qat ? "fuse_modules_qat fuses for training (call model.train())"
                       : "fusing batch norm folds its running statistics, for eval only (call model.eval(), or use "
                         "fuse_modules_qat)");
      STRATA_CHECK(bn.num_features == out, "[{}] \"{}\" has {} features for the {} output channels of \"{}\"", op,
                   names[1], bn.num_features, out, names[0]);
      STRATA_CHECK(bn.running_mean.defined(), "[{}] \"{}\" keeps no running statistics (track_running_stats=false) "
                   "to fold", op, names[1]);
    }
    kinds.push_back(kind);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    // the new modules take the first layer's mode (PyTorch's Identity placeholders do)
    const bool training = model.get_submodule(groups[g][0]).is_training();
    std::vector<std::unique_ptr<nn::Module>> layers;
    for (const std::string& n : groups[g]) {
      auto identity = std::make_unique<nn::Identity>();
      identity->train(training);
      layers.push_back(model.set_submodule(n, std::move(identity)));
    }
    std::unique_ptr<nn::Module> fused =
        qat ? std::make_unique<FusedModule>(kinds[g], std::move(layers)) : fused_eval(kinds[g], std::move(layers));
    fused->train(training);
    model.set_submodule(groups[g][0], std::move(fused));
  }
}

}  // namespace

FusedModule::FusedModule(FusedKind kind, std::vector<std::unique_ptr<nn::Module>> layers) : kind_(kind) {
  std::vector<Role> roles;
  std::string types;
  for (const auto& m : layers) {
    STRATA_CHECK(m != nullptr, "[{}] a layer is null", name());
    roles.push_back(role_of(*m));
    types += (types.empty() ? "" : ", ") + m->name();
  }
  FusedKind found{};
  STRATA_CHECK(pattern_of(roles, &found) && found == kind && kind != FusedKind::ConvTransposeBn2d,
               "[{}] cannot hold ({})", name(), types);
  for (auto& m : layers) push_back(std::move(m));
}

void FusedModule::replacing_child(nn::Module* old, nn::Module* now) {
  const nn::BatchNormBase* read = nullptr;  // the batch norm a QAT form reads
  const auto qat_batch_norm = [&](auto* layer) {
    using Layer = std::remove_pointer_t<decltype(layer)>;
    if (auto* qat = layer ? dynamic_cast<detail::QatForm<Layer>*>(layer->form()) : nullptr) read = qat->batch_norm();
  };
  if (size() > 0) {
    qat_batch_norm(dynamic_cast<nn::Conv2d*>(&(*this)[0]));
    qat_batch_norm(dynamic_cast<nn::Conv1d*>(&(*this)[0]));
    qat_batch_norm(dynamic_cast<nn::Linear*>(&(*this)[0]));
  }
  STRATA_CHECK(old == nullptr || old != read, "[{}] its batch norm is read by the QAT form of its layer "
               "(prepare_qat) and cannot be replaced before quant::convert", name());
  nn::Sequential::replacing_child(old, now);
}

void FusedModule::freeze_bn_stats() {
  if (!has_batch_norm()) return;
  bn_frozen_ = true;
  (*this)[1].train(false);
}

void FusedModule::update_bn_stats() {
  if (!has_batch_norm()) return;
  bn_frozen_ = false;
  (*this)[1].train(is_training());
}

nn::Module& FusedModule::train(bool on) {
  nn::Sequential::train(on);
  if (bn_frozen_) (*this)[1].train(false);
  return *this;
}

std::string FusedModule::name() const {
  switch (kind_) {
    case FusedKind::ConvReLU2d: return "ConvReLU2d";
    case FusedKind::ConvBn2d: return "ConvBn2d";
    case FusedKind::ConvBnReLU2d: return "ConvBnReLU2d";
    case FusedKind::LinearReLU: return "LinearReLU";
    case FusedKind::ConvReLU1d: return "ConvReLU1d";
    case FusedKind::ConvBn1d: return "ConvBn1d";
    case FusedKind::ConvBnReLU1d: return "ConvBnReLU1d";
    case FusedKind::ConvTransposeBn2d: return "ConvTransposeBn2d";
    default: return "LinearBn1d";
  }
}

void fuse_modules(nn::Module& model, const std::vector<std::vector<std::string>>& groups) {
  fuse(model, groups, false);
}

void fuse_modules_qat(nn::Module& model, const std::vector<std::vector<std::string>>& groups) {
  fuse(model, groups, true);
}

std::unique_ptr<nn::Conv2d> fuse_conv_bn_eval(const nn::Conv2d& conv, const nn::BatchNorm2d& bn) {
  return fused_conv(conv, bn);
}

std::unique_ptr<nn::Conv1d> fuse_conv_bn_eval(const nn::Conv1d& conv, const nn::BatchNorm1d& bn) {
  return fused_conv(conv, bn);
}

std::unique_ptr<nn::ConvTranspose2d> fuse_conv_bn_eval(const nn::ConvTranspose2d& conv, const nn::BatchNorm2d& bn) {
  return fused_conv(conv, bn);
}

std::unique_ptr<nn::Linear> fuse_linear_bn_eval(const nn::Linear& linear, const nn::BatchNorm1d& bn) {
  auto wb = fold_batch_norm(bn, linear.weight, linear.bias, linear.out_features, "fuse_linear_bn_eval");
  Generator unused;  // as in fused_conv
  return with_values(std::make_unique<nn::Linear>(linear.in_features, linear.out_features,
                                                  nn::LinearOptions{.bias = true, .generator = &unused}),
                     linear, std::move(wb));
}

}  // namespace strata::quant
