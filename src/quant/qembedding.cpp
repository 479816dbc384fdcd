// Row-wise quantized embeddings (include/strata/quant/qembedding.hpp): the kernels as ops of the
// registry (CPU loops of kernels/cpu/qembedding.h, CUDA launchers of cuda_quant.cpp), the
// functional forms, and the forms quantize_dynamic gives nn::Embedding and nn::EmbeddingBag.
#include <strata/quant/qembedding.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>

#include "kernels/cpu/qembedding.h"
#include "nn/embedding_internal.h"
#include "quant/cuda_quant.h"
#include "quant/dispatch.h"
#include "quant/forms.h"

namespace strata::quant {

namespace {

using qmath::Bags;
using qmath::RowwiseTable;

// What the bag kernel takes besides its tensors.
struct BagParams {
  int64_t dim, padding_idx;
  int bits;
  qmath::BagMode mode;
};

// inputs: codes, scale, bias, ids (int64), starts (int64 bags + 1, or undefined), weights (or undefined)
std::pair<RowwiseTable, Bags> bag_problem(const KernelCall& c, int64_t bags) {
  const auto& p = c.param<BagParams>();
  const auto& in = c.inputs;
  return {RowwiseTable{detail::ptr<uint8_t>(in[0]), detail::ptr<float>(in[1]), detail::ptr<float>(in[2]), p.dim,
                       p.bits},
          Bags{detail::ptr<int64_t>(in[3]), detail::ptr<int64_t>(in[4]), bags, detail::ptr<float>(in[5]),
               p.padding_idx, p.mode}};
}

struct RowwiseOps {
  OpId quantize, bag;
};

const RowwiseOps& rowwise_ops() {
  static const RowwiseOps ops = [] {
    RowwiseOps o;
    o.quantize = detail::add_op(
        "quant_quantize_rowwise", 1, {kFloat32},
        [](const KernelCall& c) {
          const Tensor& w = c.inputs[0];
          cpu::quant::quantize_rows_float_qparams(detail::ptr<float>(w), w.size(0), w.size(1), c.param<int>(),
                                                  detail::ptr<uint8_t>(c.outputs[0]), detail::ptr<float>(c.outputs[1]),
                                                  detail::ptr<float>(c.outputs[2]));
        },
        [](const KernelCall& c) {
          cuda_quant::quantize_rowwise(c.inputs[0], c.param<int>(), c.outputs[0], c.outputs[1], c.outputs[2]);
        });
    o.bag = detail::add_op(
        "quant_embedding_bag_rowwise", 6, {kUInt8},
        [](const KernelCall& c) {
          const auto [t, g] = bag_problem(c, c.outputs[0].size(0));
          cpu::quant::embedding_bag_rowwise(t, g, detail::ptr<float>(c.outputs[0]));
        },
        [](const KernelCall& c) {
          const auto [t, g] = bag_problem(c, c.outputs[0].size(0));
          cuda_quant::embedding_bag_rowwise(t, g, c.outputs[0]);
        });
    return o;
  }();
  return ops;
}

void check_rowwise(const RowwiseWeight& w, const char* op) {
  STRATA_CHECK(w.bits == 8 || w.bits == 4, "[{}] bits must be 8 or 4, got {}", op, w.bits);
  STRATA_CHECK(w.codes.defined() && w.codes.dtype() == kUInt8 && w.codes.dim() == 2 && w.dim >= 0 &&
                   w.codes.size(1) == qmath::rowwise_bytes(w.dim, w.bits),
               "[{}] expects uint8 codes (num, {}) for dim {} in {} bits, got {}", op,
               qmath::rowwise_bytes(w.dim, w.bits), w.dim, w.bits, w.codes.defined() ? w.codes.shape() : Shape{});
  for (const Tensor* t : {&w.scale, &w.bias})
    // floating, not only float32: Module::to(dtype) converts a form's floating buffers too
    STRATA_CHECK(t->defined() && is_floating(t->dtype()) && t->shape() == Shape{w.codes.size(0)} &&
                     t->device() == w.codes.device(),
                 "[{}] expects floating scales and biases of shape ({}) on {}", op, w.codes.size(0), w.codes.device());
}

// The indices as int64 on the table's device, every one checked against the table's rows.
Tensor checked_ids(const Tensor& indices, const RowwiseWeight& w, const char* op) {
  STRATA_CHECK(indices.defined() && (indices.dtype() == kInt64 || indices.dtype() == kInt32),
               "[{}] indices must be int64 or int32, got {}", op,
               indices.defined() ? fmt::format("{}", indices.dtype()) : std::string("an undefined tensor"));
  STRATA_CHECK(indices.device() == w.codes.device(), "[{}] indices are on {} and the table on {}", op,
               indices.device(), w.codes.device());
  const int64_t num = w.codes.size(0);
  const Tensor ids = indices.to(kInt64).contiguous().reshape({-1});
  const auto check = [&](const int64_t* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      STRATA_CHECK(p[i] >= 0 && p[i] < num, "[{}] index {} is out of range for {} embeddings", op, p[i], num);
  };
  if (ids.device().is_cpu()) {
    check(ids.data_ptr<int64_t>(), ids.numel());
  } else {
    const std::vector<int64_t> host = nn::detail::host_ints(ids);
    check(host.data(), static_cast<int64_t>(host.size()));
  }
  return ids;
}

Tensor run_bags(const RowwiseWeight& w, const Tensor& ids, const Tensor& starts, const Tensor& weights, int64_t bags,
                int64_t padding_idx, qmath::BagMode mode) {
  NoGradGuard no_grad;
  Tensor out = empty({bags, w.dim}, TensorOptions(kFloat32, w.codes.device()));
  const BagParams p{w.dim, padding_idx, w.bits, mode};
  detail::run(rowwise_ops().bag,
              {w.codes.contiguous(), w.scale.to(kFloat32).contiguous(), w.bias.to(kFloat32).contiguous(), ids, starts,
               weights}, {out}, &p);
  return out;
}

qmath::BagMode bag_mode(nn::EmbeddingBagMode m) {
  switch (m) {
    case nn::EmbeddingBagMode::Sum: return qmath::BagMode::Sum;
    case nn::EmbeddingBagMode::Mean: return qmath::BagMode::Mean;
    case nn::EmbeddingBagMode::Max: return qmath::BagMode::Max;
  }
  throw Error(fmt::format("[embedding_bag_rowwise] unknown mode {}", static_cast<int>(m)));
}

}  // namespace

RowwiseWeight quantize_embedding_weight(const Tensor& weight, int bits) {
  const char* op = "quantize_embedding_weight";
  STRATA_CHECK(bits == 8 || bits == 4, "[{}] bits must be 8 or 4, got {}", op, bits);
  STRATA_CHECK(weight.defined() && weight.dim() == 2 && is_floating(weight.dtype()),
               "[{}] expects a floating weight (num_embeddings, embedding_dim), got {}", op,
               weight.defined() ? fmt::format("{} {}", weight.dtype(), weight.shape()) : "an undefined tensor");
  NoGradGuard no_grad;
  const Tensor w = weight.detach().to(kFloat32).contiguous();
  const int64_t num = w.size(0), dim = w.size(1);
  const TensorOptions f32(kFloat32, w.device());
  RowwiseWeight q{empty({num, qmath::rowwise_bytes(dim, bits)}, TensorOptions(kUInt8, w.device())), empty({num}, f32),
                  empty({num}, f32), bits, dim};
  detail::run(rowwise_ops().quantize, {w}, {q.codes, q.scale, q.bias}, &bits);
  // a row whose finite values span more than float32 holds (max - min overflows) gets the scale inf
  // and dequantizes to NaN: refused rather than kept
  if (num > 0 && !std::isfinite(amax(q.scale).item<float>())) {
    const Tensor scale = q.scale.to(kCPU).contiguous();
    int64_t r = 0;
    while (r + 1 < num && std::isfinite(scale.data_ptr<float>()[r])) ++r;
    throw Error(fmt::format("[{}] row {} spans more than float32 holds (its max - min overflows): no scale "
                            "dequantizes it", op, r));
  }
  return q;
}

Tensor dequantize_embedding_weight(const RowwiseWeight& w) {
  check_rowwise(w, "dequantize_embedding_weight");
  const int64_t num = w.codes.size(0);
  // every row its own bag of one
  return run_bags(w, arange(0, num, 1, TensorOptions(kInt64, w.codes.device())), Tensor(), Tensor(), num, -1,
                  qmath::BagMode::Sum);
}

Tensor embedding_rowwise(const Tensor& indices, const RowwiseWeight& w) {
  check_rowwise(w, "embedding_rowwise");
  const Tensor ids = checked_ids(indices, w, "embedding_rowwise");
  Shape shape = indices.shape();
  shape.push_back(w.dim);
  return run_bags(w, ids, Tensor(), Tensor(), ids.numel(), -1, qmath::BagMode::Sum).reshape(shape);
}

Tensor embedding_bag_rowwise(const Tensor& indices, const RowwiseWeight& w, const nn::functional::EmbeddingBagArgs& a) {
  const char* op = "embedding_bag_rowwise";
  check_rowwise(w, op);
  const Tensor ids = checked_ids(indices, w, op);
  int64_t count = 0;
  std::vector<int64_t> starts = nn::detail::bag_starts(indices, a, &count);
  const int64_t bags = static_cast<int64_t>(starts.size()), num = w.codes.size(0);
  starts.push_back(count);
  const Tensor& psw = a.per_sample_weights;
  STRATA_CHECK(!psw.defined() || a.mode == nn::EmbeddingBagMode::Sum,
               "[{}] per_sample_weights are only supported with mode Sum", op);
  STRATA_CHECK(!psw.defined() || (psw.shape() == indices.shape() && is_floating(psw.dtype()) &&
                                  psw.device() == indices.device()),
               "[{}] per_sample_weights must be floating, of the indices' shape {} on {}", op, indices.shape(),
               indices.device());
  int64_t padding = -1;
  if (a.padding_idx) {
    STRATA_CHECK(*a.padding_idx >= -num && *a.padding_idx < num, "[{}] padding_idx {} is out of range for {} "
                 "embeddings", op, *a.padding_idx, num);
    padding = *a.padding_idx < 0 ? *a.padding_idx + num : *a.padding_idx;
  }
  const Tensor weights = psw.defined() ? psw.detach().to(kFloat32).contiguous().reshape({-1}) : Tensor();
  return run_bags(w, ids, from_vector(starts).to(w.codes.device()), weights, bags, padding, bag_mode(a.mode));
}

namespace detail {

namespace {

// Registers the table's tensors as the form's buffers (they enter the state dict and move with it).
void register_rowwise(nn::Module& form, RowwiseWeight& w) {
  w.codes = form.register_buffer(w.bits == 8 ? "weight_uint8" : "weight_uint4x2", w.codes);
  w.scale = form.register_buffer("weight_scale", w.scale);
  w.bias = form.register_buffer("weight_bias", w.bias);
}

class RowwiseEmbeddingForm : public nn::EmbeddingForm {
 public:
  explicit RowwiseEmbeddingForm(RowwiseWeight w) : weight_(std::move(w)) { register_rowwise(*this, weight_); }
  Tensor forward_layer(const nn::Embedding&, const Tensor& indices) override {
    return embedding_rowwise(indices, weight_);
  }
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "RowwiseEmbeddingForm"; }

 private:
  RowwiseWeight weight_;
};

class RowwiseEmbeddingBagForm : public nn::EmbeddingBagForm {
 public:
  explicit RowwiseEmbeddingBagForm(RowwiseWeight w) : weight_(std::move(w)) { register_rowwise(*this, weight_); }
  Tensor forward_bags(const nn::EmbeddingBag& layer, const Tensor& indices, const Tensor& offsets,
                      const Tensor& per_sample_weights) override {
    const nn::EmbeddingBagOptions& o = layer.options;
    return embedding_bag_rowwise(indices, weight_,
                                 {offsets, o.mode, per_sample_weights, o.include_last_offset, o.padding_idx});
  }
  bool replaces_weight() const override { return true; }
  std::string name() const override { return "RowwiseEmbeddingBagForm"; }

 private:
  RowwiseWeight weight_;
};

}  // namespace

std::unique_ptr<nn::EmbeddingForm> rowwise_form(const nn::Embedding& layer, int bits) {
  return std::make_unique<RowwiseEmbeddingForm>(quantize_embedding_weight(layer.weight, bits));
}

std::unique_ptr<nn::EmbeddingBagForm> rowwise_form(const nn::EmbeddingBag& layer, int bits) {
  return std::make_unique<RowwiseEmbeddingBagForm>(quantize_embedding_weight(layer.weight, bits));
}

}  // namespace detail

}  // namespace strata::quant
