// DTensor (torch.distributed.tensor): a tensor laid out over a DeviceMesh, one Placement per mesh
// dim: Shard(d) splits tensor dim d over that mesh dim's ranks as torch.chunk does (the first
// ranks take the larger pieces), Replicate() gives every rank the whole, Partial(op) leaves each
// rank a part whose reduction over the mesh dim is the value.
//
//   auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});        // mpirun -np 4
//   dist::DTensor x = dist::distribute_tensor(full, mesh, {dist::Shard(0), dist::Replicate()});
//   dist::DTensor y = x.redistribute(mesh, {dist::Replicate(), dist::Shard(1)});   // all-gather, chunk
//   Tensor mine = y.to_local();            // this rank's piece, a plain tensor
//   Tensor whole = y.full_tensor();        // the global value on every rank
//
// Autograd flows through the local tensors. The gradient of a DTensor is laid out as the DTensor
// is, with Partial read as Replicate (the gradient of a sum of parts is the same for every part),
// and redistribute, from_local, to_local and full_tensor carry it back with the adjoint
// communication (Shard->Replicate's backward is Replicate->Shard, and so on). Every call that
// communicates is collective over the mesh: all its ranks make it in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <strata/dist/device_mesh.hpp>
#include <strata/nn/functional.hpp>

namespace strata::dist {

/// How one mesh dim lays out a DTensor (torch's Shard, Replicate, Partial placements).
struct STRATA_API Placement {
  enum class Kind : uint8_t { Shard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;                   // Shard: the tensor dim split over the mesh dim
  ReduceOp reduce_op = ReduceOp::Sum;  // Partial: how the parts combine (Sum, Avg, Max, Min)

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int64_t d) const { return kind == Kind::Shard && dim == d; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  /// "Shard(0)", "Replicate()", "Partial(sum)".
  std::string str() const;
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::Shard || dim == o.dim) &&
           (kind != Kind::Partial || reduce_op == o.reduce_op);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
};

/// Placement factories named as PyTorch's classes. A negative dim counts from the end.
STRATA_API Placement Shard(int64_t dim);
STRATA_API Placement Replicate();
/// `op`: Sum, Avg, Max or Min (Product raises).
STRATA_API Placement Partial(ReduceOp op = ReduceOp::Sum);

class STRATA_API DTensor {
 public:
  DTensor() = default;

  /// torch's DTensor.from_local: wraps this rank's `local` piece, which keeps its autograd history.
  /// `shape` (the global shape) defaults to the local shape times the mesh size along each
  /// sharded dim (even shards); pass it for uneven ones. With `run_check`, every rank's dtype,
  /// global shape, placements and local shape are compared over the mesh (raising on every rank
  /// alike where they disagree) and the first rank's data along each Replicate mesh dim is
  /// broadcast into `local`, in place.
  static DTensor from_local(const Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            bool run_check = false, std::optional<Shape> shape = std::nullopt);

  bool defined() const { return local_.defined(); }
  /// This rank's piece. `grad_placements`: how the gradient arriving at the result is laid out
  /// (e.g. Partial where each rank computed its own loss from it); it is redistributed to this
  /// DTensor's layout in backward. Default: as this DTensor's placements. They may trade Replicate
  /// and Partial only: a Shard where the DTensor has another placement raises.
  Tensor to_local(std::optional<std::vector<Placement>> grad_placements = std::nullopt) const;
  /// The global value on every rank (redistribute to Replicate everywhere, then to_local).
  Tensor full_tensor(std::optional<std::vector<Placement>> grad_placements = std::nullopt) const;
  /// The same global value with `placements` (every transition: all-gather, chunk, all-reduce,
  /// reduce-scatter, all-to-all, Replicate->Partial). `mesh` must equal this DTensor's.
  DTensor redistribute(const DeviceMesh& mesh, std::vector<Placement> placements) const;
  DTensor redistribute(std::vector<Placement> placements) const {
    return redistribute(device_mesh(), std::move(placements));
  }

  const DeviceMesh& device_mesh() const;
  const std::vector<Placement>& placements() const { return placements_; }
  /// The global shape and (contiguous) strides.
  const Shape& shape() const { return shape_; }
  int64_t size(int64_t dim) const;
  Strides stride() const;
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  DType dtype() const { return local_.dtype(); }
  Device device() const { return local_.device(); }

  bool requires_grad() const { return local_.requires_grad(); }
  /// Makes the local piece a leaf that requires grad (it must be one already, or have no history).
  const DTensor& requires_grad_(bool requires_grad = true) const;
  /// The accumulated gradient as a DTensor (Partial placements read as Replicate); undefined
  /// before backward reaches the local piece.
  DTensor grad() const;
  /// Backward from a one-element DTensor (a loss, Replicate or Partial): every rank must call it.
  void backward() const;
  DTensor detach() const;
  std::string str() const;

 private:
  friend struct DTensorAccess;
  Tensor local_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::vector<Placement> placements_;
  Shape shape_;
};

/// torch's distribute_tensor: `tensor` (same shape on every rank) laid out over `mesh`; the data
/// of the first rank along each mesh dim is what is scattered (Shard) or broadcast (Replicate).
/// Partial placements raise. The result is a leaf that requires grad when `tensor` does.
/// Collective over the mesh; ranks whose shapes disagree all raise.
STRATA_API DTensor distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh,
                                     std::vector<Placement> placements);

// Ops with sharding propagation (see docs/dtensor.md for the rules). Operands must share a mesh;
// where their placements do not fit the op, they are first redistributed to ones that do (the
// choice needing the least communication, Replicate at worst). Differentiable.
/// Elementwise with broadcasting (torch's rules on the global shapes).
STRATA_API DTensor add(const DTensor& a, const DTensor& b);
STRATA_API DTensor sub(const DTensor& a, const DTensor& b);
STRATA_API DTensor mul(const DTensor& a, const DTensor& b);
STRATA_API DTensor relu(const DTensor& x);
STRATA_API DTensor gelu(const DTensor& x, std::string_view approximate = "none");
/// a (*, K) @ b (K, N): Shard(last) x Shard(0) -> Partial, Replicate x Shard(1) -> Shard(last),
/// Shard(d) x Replicate -> Shard(d) for a batch or row dim d of a.
STRATA_API DTensor matmul(const DTensor& a, const DTensor& b);
/// x W^T + b, W (out, in): a colwise-sharded W (Shard(0)) gives an output sharded on its last dim,
/// a rowwise-sharded one (Shard(1)) with x sharded on its last dim a Partial output.
STRATA_API DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias = DTensor());
/// Sum over `dims` (all dims when empty): a sharded dim summed becomes Partial(sum).
STRATA_API DTensor sum(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// dims dim0 and dim1 swapped, shard dims with them; no communication.
STRATA_API DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1);

/// exp and tanh reduce Partial operands first; neg and scalar mul/div keep Partial(sum/avg) (neg
/// turns Partial(max) into Partial(min)). Shards and replicas stay.
STRATA_API DTensor exp(const DTensor& x);
STRATA_API DTensor tanh(const DTensor& x);
STRATA_API DTensor neg(const DTensor& x);
STRATA_API DTensor mul(const DTensor& x, Scalar s);
STRATA_API DTensor div(const DTensor& x, Scalar s);
/// Mean over `dims` (all when empty): sum, then divided by the count, so a sharded dim averaged
/// becomes Partial(sum) of the local sums over the global count.
STRATA_API DTensor mean(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Softmax / log-softmax over `dim`: a Shard of `dim` is gathered (Replicate) first, Partial
/// reduced; other shards stay.
STRATA_API DTensor softmax(const DTensor& x, int64_t dim);
STRATA_API DTensor log_softmax(const DTensor& x, int64_t dim);
/// Layer norm over the trailing `normalized_shape` dims: Shards of those dims are gathered first;
/// weight and bias (optional, of normalized_shape) are replicated.
STRATA_API DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const DTensor& weight = DTensor(),
                              const DTensor& bias = DTensor(), double eps = 1e-5);
/// The same elements in `shape` (one -1 inferred). A sharded dim stays sharded where it is kept
/// whole, or is the leading dim of a merge or split whose leading sizes divide evenly over the mesh
/// dim; otherwise it is gathered first. view is reshape (pieces may be non-contiguous).
STRATA_API DTensor reshape(const DTensor& x, const Shape& shape);
inline DTensor view(const DTensor& x, const Shape& shape) { return reshape(x, shape); }
STRATA_API DTensor unsqueeze(const DTensor& x, int64_t dim);
/// Removes `dim` (all size-1 dims without one) if its size is 1; a Shard of it becomes Replicate.
STRATA_API DTensor squeeze(const DTensor& x, std::optional<int64_t> dim = std::nullopt);
/// Cross entropy of logits (N, C) against class indices (N) or probabilities (N, C), the batch
/// Replicate or Shard(0) (a Shard of the classes is gathered). "mean" and "sum" give a Replicate
/// loss where no mesh dim shards the batch, else Partial(sum) (the mean divides by the global
/// count of targets, or their summed class weights); "none" gives (N) laid out as the batch.
STRATA_API DTensor cross_entropy(const DTensor& input, const DTensor& target,
                                 const nn::functional::CrossEntropyOptions& options = {});

inline DTensor operator+(const DTensor& a, const DTensor& b) { return add(a, b); }
inline DTensor operator-(const DTensor& a, const DTensor& b) { return sub(a, b); }
inline DTensor operator*(const DTensor& a, const DTensor& b) { return mul(a, b); }
inline DTensor operator*(const DTensor& a, Scalar s) { return mul(a, s); }
inline DTensor operator/(const DTensor& a, Scalar s) { return div(a, s); }
inline DTensor operator-(const DTensor& a) { return neg(a); }

}  // namespace strata::dist
