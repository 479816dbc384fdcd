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
