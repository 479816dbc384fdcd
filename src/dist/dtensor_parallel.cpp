// parallelize_module's Colwise and Rowwise styles on nn::Linear, as a Linear form over the layer's
// local shards, and distribute_module's parameter layout and hooks.
#include <strata/dist/dtensor_parallel.hpp>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/linear.hpp>

#include "dtensor_layout.h"

namespace strata::dist {

using namespace dtensor_detail;

namespace {

// Views the layer's shards and its input as DTensors and runs dist::linear on them.
class TensorParallelLinear final : public nn::LinearForm {
 public:
  TensorParallelLinear(const DeviceMesh& mesh, bool colwise, Placement input, Placement output, int64_t in,
                       int64_t out)
      : mesh_(mesh), colwise_(colwise), input_(input), output_(output), in_(in), out_(out) {}

  Tensor forward_layer(const nn::Linear& layer, const Tensor& input) override {
    const Placement in = normalize(name().c_str(), {input_}, input.dim(), mesh_)[0];
    Shape shape = input.shape();
    if (in.is_shard()) {
      auto& size = shape[static_cast<size_t>(in.dim)];
      size = in.dim == input.dim() - 1 ? in_ : size * mesh_.size();  // other dims: even pieces, as torch
    }
    DTensor x = DTensor::from_local(input, mesh_, {in}, false, shape);
    DTensor w = DTensor::from_local(layer.weight, mesh_, {colwise_ ? Shard(0) : Shard(1)}, false, Shape{out_, in_});
    DTensor b;
    if (layer.bias.defined())
      b = DTensor::from_local(layer.bias, mesh_, {colwise_ ? Shard(0) : Replicate()}, false, Shape{out_});
    DTensor y = linear(x.redistribute({colwise_ ? Replicate() : Shard(-1)}), w, b);
    return y.redistribute({output_}).to_local();
  }
  bool replaces_weight() const override { return false; }
  std::string name() const override { return colwise_ ? "ColwiseParallel" : "RowwiseParallel"; }

  LinearLayouts layouts() const {
    auto mesh = std::make_shared<const DeviceMesh>(mesh_);
    return {{mesh, {out_, in_}, {colwise_ ? Shard(0) : Shard(1)}}, {mesh, {out_}, {colwise_ ? Shard(0) : Replicate()}}};
  }

 private:
  DeviceMesh mesh_;
  bool colwise_;
  Placement input_, output_;
  int64_t in_, out_;  // the layer's global features
};

// `t`'s data replaced by its piece laid out as `placements` (scattered from the mesh's first rank).
void lay_out(const Tensor& t, const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  NoGradGuard no_grad;
  t.set_data(distribute_tensor(t.detach(), mesh, placements).to_local());
}

nn::Linear& parallelizable_linear(const std::string& path, nn::Module& module) {
  auto* layer = dynamic_cast<nn::Linear*>(&module);
  STRATA_CHECK(layer != nullptr, "[parallelize_module] '{}' is a {}; ColwiseParallel and RowwiseParallel apply to "
               "Linear layers", path, module.name());
  STRATA_CHECK(layer->weight.defined() && layer->form() == nullptr,
               "[parallelize_module] the Linear '{}' already has a form ({}); it cannot be parallelized as well", path,
               layer->form() ? layer->form()->name() : "");
  return *layer;
}

void parallelize_linear(nn::Linear* layer, const DeviceMesh& mesh, const ParallelStyle& style) {
  const bool colwise = std::holds_alternative<ColwiseParallel>(style);
  const Placement input = colwise ? std::get<ColwiseParallel>(style).input_layouts
                                  : std::get<RowwiseParallel>(style).input_layouts;
  const Placement output = colwise ? std::get<ColwiseParallel>(style).output_layouts
                                   : std::get<RowwiseParallel>(style).output_layouts;
  const int64_t in = layer->in_features, out = layer->out_features;
  lay_out(layer->weight, mesh, {colwise ? Shard(0) : Shard(1)});
  if (layer->bias.defined()) lay_out(layer->bias, mesh, {colwise ? Shard(0) : Replicate()});
  // Linear checks its input's last dim: where the input arrives cut along it, that is the piece
  if (input.is_shard() && input.dim == -1)
    layer->in_features = chunk_piece(in, mesh.size(), mesh.get_local_rank()).length;
  layer->set_form("tensor_parallel", std::make_unique<TensorParallelLinear>(mesh, colwise, input, output, in, out));
}

bool matches(const std::string& pattern, const std::string& path) {
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    size_t start = 0;
    if (s.empty()) return parts;
    for (size_t dot = s.find('.'); ; dot = s.find('.', start)) {
      parts.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return parts;
  };
  const auto p = split(pattern), n = split(path);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != n[i]) return false;
  return true;
}

}  // namespace

namespace dtensor_detail {

std::optional<LinearLayouts> tensor_parallel_layouts(const nn::Linear& layer) {
  const auto* form = dynamic_cast<const TensorParallelLinear*>(layer.form());
  return form ? std::optional<LinearLayouts>(form->layouts()) : std::nullopt;
}

}  // namespace dtensor_detail

nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                               const std::map<std::string, ParallelStyle>& plan) {
  STRATA_CHECK(mesh.ndim() == 1, "[parallelize_module] needs a 1-D mesh, this one has {} dims; pass a slice "
               "(mesh[\"tp\"])", mesh.ndim());
  const auto modules = module.named_modules();
  // the whole plan is checked before any layer changes, so a bad entry leaves the module as it was
  std::map<nn::Linear*, std::pair<std::string, const ParallelStyle*>> layers;
  for (const auto& [pattern, style] : plan) {
    STRATA_CHECK(pattern.find_first_of("?[") == std::string::npos,
                 "[parallelize_module] '{}': only '*' parts are supported as wildcards", pattern);
    bool found = false;
    for (const auto& [path, child] : modules) {
      if (!matches(pattern, path)) continue;
      const auto [it, added] = layers.try_emplace(&parallelizable_linear(path, *child), pattern, &style);
      STRATA_CHECK(added, "[parallelize_module] the plan names '{}' twice ('{}' and '{}')", path, it->second.first,
                   pattern);
      found = true;
    }
    STRATA_CHECK(found, "[parallelize_module] the plan names '{}', which matches no submodule", pattern);
  }
  // in the order of named_modules, the same on every rank (the layouts communicate)
  for (const auto& [path, child] : modules)
    if (auto it = layers.find(dynamic_cast<nn::Linear*>(child)); it != layers.end()) {
      parallelize_linear(it->first, mesh, *it->second.second);
      layers.erase(it);
    }
  return module;
}

nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style) {
  return parallelize_module(module, mesh, std::map<std::string, ParallelStyle>{{"", style}});
}

nn::Module& distribute_module(nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn, InputFn input_fn,
                              OutputFn output_fn) {
  if (partition_fn) {
    for (const auto& [name, child] : module.named_modules()) partition_fn(name, *child, mesh);
  } else {
    const std::vector<Placement> replicated(static_cast<size_t>(mesh.ndim()), Replicate());
    for (const Tensor& p : module.parameters()) lay_out(p, mesh, replicated);
    for (const Tensor& b : module.buffers()) lay_out(b, mesh, replicated);
  }
  if (input_fn)
    module.register_forward_pre_hook([input_fn, mesh](nn::Module& m, const Tensor& x) -> std::optional<Tensor> {
      return input_fn(m, x, mesh);
    });
  if (output_fn)
    module.register_forward_hook(
        [output_fn, mesh](nn::Module& m, const Tensor&, const Tensor& y) -> std::optional<Tensor> {
          return output_fn(m, y, mesh);
        });
  return module;
}

}  // namespace strata::dist
