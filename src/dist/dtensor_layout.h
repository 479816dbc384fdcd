// What the DTensor sources share: torch.chunk's piece sizes, the shape of the block a rank holds
// after some mesh dims have split it, placement checks, and the differentiable redistribution
// of a local piece.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <strata/dist/dtensor.hpp>

namespace strata::nn {
class Linear;
}

namespace strata::dist {

/// A DTensor's layout without its data: the mesh, the global shape and the placements.
struct DLayout {
  std::shared_ptr<const DeviceMesh> mesh;
  Shape shape;
  std::vector<Placement> placements;
};

/// Builds DTensors and reads their parts inside the library.
struct DTensorAccess {
  static DTensor make(Tensor local, DLayout layout);
  static DLayout layout(const DTensor& t);
  static const Tensor& local(const DTensor& t) { return t.local_; }
};

namespace dtensor_detail {

/// Piece `r` of `n` over a dim of `size`, as torch.chunk cuts it: pieces of ceil(size / n), the
/// last ones shorter or empty.
struct Piece {
  int64_t offset, length;
};
Piece chunk_piece(int64_t size, int n, int r);

/// Checks one placement per mesh dim, shard dims within `ndim` (negative ones made positive) and
/// Partial's reduce op; raises naming `op`.
std::vector<Placement> normalize(const char* op, std::vector<Placement> placements, int64_t ndim,
                                 const DeviceMesh& mesh);
/// The shape of the block this rank holds once mesh dims [0, upto) have split `global`.
Shape block_shape(const Shape& global, const std::vector<Placement>& placements, const DeviceMesh& mesh, int upto);
inline Shape local_shape(const Shape& global, const std::vector<Placement>& placements, const DeviceMesh& mesh) {
  return block_shape(global, placements, mesh, mesh.ndim());
}
/// A gradient's layout: Partial read as Replicate.
std::vector<Placement> grad_placements(std::vector<Placement> placements);
std::string text(const std::vector<Placement>& placements);

/// `local` (laid out as `from`) laid out as `to` over the same mesh and shape; differentiable,
/// its backward redistributing the gradient from grad_placements(to) to grad_placements(from).
Tensor redistribute_local(const Tensor& local, const DLayout& from, const std::vector<Placement>& to);
/// Identity forward; backward redistributes the gradient from `grad_from` to `grad_to`.
Tensor with_grad_layout(const Tensor& local, const DLayout& layout, const std::vector<Placement>& grad_from,
                        const std::vector<Placement>& grad_to);

/// Partial(max) and Partial(min) read as Replicate (no linear op may keep them).
Placement linear_or_replicate(const Placement& p);
/// The local piece of `x` laid out as `target` for an op whose output is laid out as `out`; where
/// it is Replicate and the output not, its gradient is all-reduced in backward (Megatron's "f").
Tensor operand(const DTensor& x, const std::vector<Placement>& target, const std::vector<Placement>& out);
/// A DTensor on `like`'s mesh holding `local`.
DTensor result(const DTensor& like, Tensor local, Shape shape, std::vector<Placement> placements);

/// The global layouts of a tensor-parallel Linear's weight and bias; nullopt for any other Linear.
struct LinearLayouts {
  DLayout weight, bias;
};
std::optional<LinearLayouts> tensor_parallel_layouts(const nn::Linear& layer);

}  // namespace dtensor_detail
}  // namespace strata::dist
