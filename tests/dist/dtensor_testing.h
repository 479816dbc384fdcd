// What the DTensor tests share: the reference layout, worked out here with strata::chunk on the
// global tensor (torch.chunk's cut, mesh dim after mesh dim), partial parts built from a known
// split of the value, and the placements the tests go through.
#pragma once

#include <string>
#include <vector>

#include "dist/dist_testing.h"

namespace strata::dtensor_testing {

using dist::Placement;
using Placements = std::vector<Placement>;

// This rank's block of `global` under `placements` (Partial read as Replicate).
inline Tensor expected_local(const Tensor& global, const Placements& placements, const dist::DeviceMesh& mesh) {
  Tensor t = global.detach();
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    std::vector<Tensor> pieces = chunk(t, mesh.size(i), p.dim);
    const auto c = static_cast<size_t>(mesh.get_local_rank(i));
    t = c < pieces.size() ? pieces[c] : t.narrow(p.dim, t.size(p.dim), 0);
  }
  return t.contiguous();
}

// The weight of this rank's part along a Partial(sum) mesh dim: (c + 1) / (1 + 2 + ... + n), so
// the parts sum to the value and differ from rank to rank.
inline double part_weight(int c, int n) { return (c + 1) / (n * (n + 1) / 2.0); }

// A local piece of `global` laid out as `placements`, Partial(sum) ones split by part_weight,
// wrapped with from_local; `requires_grad` makes the piece a leaf.
inline dist::DTensor make_dtensor(const Tensor& global, const Placements& placements, const dist::DeviceMesh& mesh,
                                  bool requires_grad = false) {
  Tensor local = expected_local(global, placements, mesh).clone();
  for (int i = 0; i < mesh.ndim(); ++i)
    if (placements[static_cast<size_t>(i)].is_partial())
      local = local * part_weight(mesh.get_local_rank(i), mesh.size(i));
  if (requires_grad) local.requires_grad_(true);
  return dist::DTensor::from_local(local, mesh, placements, false, global.shape());
}

inline std::string text(const Placements& placements) {
  std::string s;
  for (const Placement& p : placements) s += (s.empty() ? "" : ", ") + p.str();
  return "[" + s + "]";
}

// Every list of one placement per mesh dim drawn from `choices`.
inline std::vector<Placements> all_combinations(const Placements& choices, int mesh_ndim) {
  std::vector<Placements> out{{}};
  for (int i = 0; i < mesh_ndim; ++i) {
    std::vector<Placements> next;
    for (const Placements& prefix : out)
      for (const Placement& c : choices) {
        next.push_back(prefix);
        next.back().push_back(c);
      }
    out = std::move(next);
  }
  return out;
}

// Shard of every dim, Replicate and Partial.
inline Placements choices_for(const Shape& shape) {
  Placements c{dist::Replicate(), dist::Partial()};
  for (size_t d = 0; d < shape.size(); ++d) c.push_back(dist::Shard(static_cast<int64_t>(d)));
  return c;
}

// The output's pieces summed against the loss weights' blocks: the gradient of sum(out * w).
inline void backward_through_pieces(const dist::DTensor& out, const Tensor& w) {
  Placements read;
  for (const Placement& p : out.placements()) read.push_back(p.is_partial() ? dist::Replicate() : p);
  (out.to_local() * expected_local(w, read, out.device_mesh())).sum().backward();
}

// Linear(6, hidden), ReLU, Linear(hidden, 5) in float64, the same weights on every rank.
struct Mlp {
  nn::Sequential net;
  explicit Mlp(int64_t hidden) {
    Generator g1(3), g2(4);
    net.push_back(nn::Linear(6, hidden, {.generator = &g1}));
    net.push_back(nn::ReLU());
    net.push_back(nn::Linear(hidden, 5, {.generator = &g2}));
    net.to(kFloat64);
  }
  nn::Linear& fc(int i) { return dynamic_cast<nn::Linear&>(net.get_submodule(std::to_string(i))); }
};

// The block of `whole` this rank holds when cut along `dim` over `tp` (torch.chunk's pieces).
inline Tensor block(const Tensor& whole, int64_t dim, const dist::DeviceMesh& tp) {
  return expected_local(whole, {dist::Shard(dim)}, tp);
}

// A float64 tensor with distinct values, the same on every rank.
inline Tensor global_values(const Shape& shape, double phase = 0.0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return sin(arange(n, TensorOptions(kFloat64)).add(phase + 0.5)).view(shape).mul(3.0);
}

inline bool close(const Tensor& got, const Tensor& want) {
  return got.shape() == want.shape() && allclose(got, want, 1e-12, 1e-12);
}

}  // namespace strata::dtensor_testing
