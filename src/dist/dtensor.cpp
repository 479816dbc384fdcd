// DTensor: placements, layouts (torch.chunk's pieces over each mesh dim in turn), from_local,
// distribute_tensor and the accessors. The communication lives in dtensor_redistribute.cpp.
#include <numeric>

#include <strata/ops/creation.hpp>

#include "dtensor_layout.h"

namespace strata::dist {

using namespace dtensor_detail;

namespace {

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

// A 64-bit FNV-1a digest of what every rank must agree on (dtype, shapes, placements).
int64_t digest(const std::vector<int64_t>& values) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : values) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(v) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h >> 1);
}

std::vector<int64_t> describe(DType dtype, const Shape& shape, const std::vector<Placement>& placements) {
  std::vector<int64_t> v{static_cast<int64_t>(dtype), static_cast<int64_t>(shape.size())};
  v.insert(v.end(), shape.begin(), shape.end());
  for (const Placement& p : placements)
    v.insert(v.end(), {static_cast<int64_t>(p.kind), p.dim, static_cast<int64_t>(p.reduce_op)});
  return v;
}

// Raises on every rank of `mesh` alike where some rank's `local_error` is set or the ranks'
// `meta` differ: the maximum and minimum of a flag and a digest travel along each mesh dim in
// turn, which reduces them over the whole mesh.
void check_mesh_agrees(const char* op, const DeviceMesh& mesh, Device device, const std::vector<int64_t>& meta,
                       const std::string& local_error) {
  const int64_t failed = local_error.empty() ? 0 : 1, d = digest(meta);
  Tensor v = from_vector(std::vector<int64_t>{failed, d, -failed, -d}).to(device);
  for (int i = 0; i < mesh.ndim(); ++i) mesh.get_group(i)->allreduce(v, ReduceOp::Max)->wait();
  v = v.to(kCPU);
  const auto* m = v.data_ptr<int64_t>();
  STRATA_CHECK(local_error.empty(), "{}", local_error);
  STRATA_CHECK(m[0] == 0, "[{}] another rank of the mesh raised an error (see its message)", op);
  STRATA_CHECK(m[1] == -m[3], "[{}] the ranks of the mesh disagree on the dtype, the global shape or the placements "
               "(this rank: {}, shape {})", op, dtype_name(static_cast<DType>(meta[0])),
               Shape(meta.begin() + 2, meta.begin() + 2 + meta[1]));
}

// `block` cut along `d` over `g`: group rank 0's pieces scattered, padded to one size.
Tensor scatter_dim(const Tensor& block, const std::shared_ptr<ProcessGroup>& g, int64_t d) {
  const int n = g->size();
  const int64_t size = block.size(d), step = (size + n - 1) / n;
  if (step == 0 || n == 1) return block;
  Shape piece_shape = block.shape();
  piece_shape[static_cast<size_t>(d)] = step;
  std::vector<Tensor> pieces;
  if (g->rank() == 0) {
    Tensor padded = zeros([&] { Shape s = block.shape(); s[static_cast<size_t>(d)] = step * n; return s; }(),
                          block.options());
    padded.narrow(d, 0, size).copy_(block);
    for (int r = 0; r < n; ++r) pieces.push_back(padded.narrow(d, r * step, step).contiguous());
  }
  Tensor out = empty(piece_shape, block.options());
  g->scatter(out, pieces, 0)->wait();
  return out.narrow(d, 0, chunk_piece(size, n, g->rank()).length).contiguous();
}

}  // namespace

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard: return "Shard(" + std::to_string(dim) + ")";
    case Kind::Replicate: return "Replicate()";
    case Kind::Partial: return std::string("Partial(") + reduce_name(reduce_op) + ")";
  }
  return "?";
}

Placement Shard(int64_t dim) { return {Placement::Kind::Shard, dim, ReduceOp::Sum}; }
Placement Replicate() { return {}; }
Placement Partial(ReduceOp op) {
  STRATA_CHECK(op != ReduceOp::Product, "[Partial] the reduce op must be Sum, Avg, Max or Min, got product");
  return {Placement::Kind::Partial, 0, op};
}

namespace dtensor_detail {

Piece chunk_piece(int64_t size, int n, int r) {
  const int64_t step = (size + n - 1) / n;
  const int64_t offset = std::min(size, r * step);
  return {offset, std::min(step, size - offset)};
}

std::vector<Placement> normalize(const char* op, std::vector<Placement> placements, int64_t ndim,
                                 const DeviceMesh& mesh) {
  STRATA_CHECK(static_cast<int>(placements.size()) == mesh.ndim(),
               "[{}] {} placements given for a {}-dim mesh: one per mesh dim", op, placements.size(), mesh.ndim());
  for (Placement& p : placements) {
    if (p.is_shard()) {
      STRATA_CHECK(p.dim >= -ndim && p.dim < ndim, "[{}] {} is out of range for a tensor of {} dims", op, p.str(),
                   ndim);
      if (p.dim < 0) p.dim += ndim;
    }
    STRATA_CHECK(!p.is_partial() || p.reduce_op != ReduceOp::Product,
                 "[{}] Partial's reduce op must be Sum, Avg, Max or Min, got product", op);
  }
  return placements;
}

Shape block_shape(const Shape& global, const std::vector<Placement>& placements, const DeviceMesh& mesh, int upto) {
  Shape shape = global;
  for (int i = 0; i < upto; ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    auto& size = shape[static_cast<size_t>(p.dim)];
    size = chunk_piece(size, mesh.size(i), mesh.get_local_rank(i)).length;
  }
  return shape;
}

std::vector<Placement> grad_placements(std::vector<Placement> placements) {
  for (Placement& p : placements)
    if (p.is_partial()) p = Replicate();
  return placements;
}

std::string text(const std::vector<Placement>& placements) {
  std::string s;
  for (const Placement& p : placements) s += (s.empty() ? "" : ", ") + p.str();
  return "[" + s + "]";
}

}  // namespace dtensor_detail

DTensor DTensorAccess::make(Tensor local, DLayout layout) {
  DTensor t;
  t.local_ = std::move(local);
  t.mesh_ = std::move(layout.mesh);
  t.placements_ = std::move(layout.placements);
  t.shape_ = std::move(layout.shape);
  return t;
}

DLayout DTensorAccess::layout(const DTensor& t) { return {t.mesh_, t.shape_, t.placements_}; }

DTensor DTensor::from_local(const Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            bool run_check, std::optional<Shape> shape) {
  STRATA_CHECK(local.defined(), "[DTensor.from_local] the local tensor is undefined");
  // with run_check, what fails here fails on every rank alike (check_mesh_agrees)
  Shape global = local.shape();
  std::string error;
  try {
    placements = normalize("DTensor.from_local", std::move(placements), local.dim(), mesh);
    if (shape) {
      STRATA_CHECK(shape->size() == global.size(), "[DTensor.from_local] the global shape {} has {} dims, the "
                   "local tensor {}", *shape, shape->size(), local.dim());
      global = *shape;
    } else {
      for (int i = 0; i < mesh.ndim(); ++i) {
        const Placement& p = placements[static_cast<size_t>(i)];
        if (p.is_shard()) global[static_cast<size_t>(p.dim)] *= mesh.size(i);
      }
    }
    const Shape expected = local_shape(global, placements, mesh);
    STRATA_CHECK(expected == local.shape(), "[DTensor.from_local] this rank's local tensor has shape {}, but a "
                 "global shape {} with placements {} gives it {}", local.shape(), global,
                 text(placements), expected);
  } catch (const Error& e) {
    if (!run_check) throw;
    error = e.what();
  }
  if (run_check) {
    check_mesh_agrees("DTensor.from_local", mesh, local.device(), describe(local.dtype(), global, placements),
                      error);
    Tensor data = local.detach();
    for (int i = 0; i < mesh.ndim(); ++i)
      if (placements[static_cast<size_t>(i)].is_replicate()) mesh.get_group(i)->broadcast(data, 0)->wait();
  }
  return DTensorAccess::make(local, {std::make_shared<const DeviceMesh>(mesh), global, std::move(placements)});
}

DTensor distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh, std::vector<Placement> placements) {
  STRATA_CHECK(tensor.defined(), "[distribute_tensor] the tensor is undefined");
  std::string error;
  try {
    placements = normalize("distribute_tensor", std::move(placements), tensor.dim(), mesh);
    for (const Placement& p : placements)
      STRATA_CHECK(!p.is_partial(), "[distribute_tensor] {} is not a placement to distribute a tensor with "
                   "(redistribute a Replicate DTensor to it)", p.str());
  } catch (const Error& e) {
    error = e.what();
  }
  check_mesh_agrees("distribute_tensor", mesh, tensor.device(),
                    describe(tensor.dtype(), tensor.shape(), placements), error);
  Tensor local = tensor.detach().clone();
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (p.is_shard()) {
      local = scatter_dim(local, mesh.get_group(i), p.dim);
    } else if (mesh.size(i) > 1) {
      mesh.get_group(i)->broadcast(local, 0)->wait();
    }
  }
  if (tensor.requires_grad()) local.requires_grad_(true);
  return DTensorAccess::make(local, {std::make_shared<const DeviceMesh>(mesh), tensor.shape(), std::move(placements)});
}

const DeviceMesh& DTensor::device_mesh() const {
  STRATA_CHECK(mesh_ != nullptr, "[DTensor] use of an undefined DTensor");
  return *mesh_;
}

Tensor DTensor::to_local(std::optional<std::vector<Placement>> grad_placements_in) const {
  if (!grad_placements_in) return local_;
  auto from = normalize("DTensor.to_local", std::move(*grad_placements_in), ndim(), device_mesh());
  // the gradient has the local tensor's shape: it can differ in Replicate / Partial only (a rule
  // on the placements alone, so every rank raises alike)
  for (size_t i = 0; i < from.size(); ++i)
    STRATA_CHECK(from[i].is_shard() == placements_[i].is_shard() && (!from[i].is_shard() || from[i] == placements_[i]),
                 "[DTensor.to_local] grad_placements {} do not cut the local tensor as the placements {} do (mesh dim "
                 "{}); only Replicate and Partial may differ", text(from), text(placements_), i);
  return with_grad_layout(local_, DTensorAccess::layout(*this), from, grad_placements(placements_));
}

Tensor DTensor::full_tensor(std::optional<std::vector<Placement>> grad_placements_in) const {
  return redistribute(std::vector<Placement>(placements_.size(), Replicate())).to_local(std::move(grad_placements_in));
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, std::vector<Placement> placements) const {
  STRATA_CHECK(mesh == device_mesh(), "[DTensor.redistribute] the target mesh (shape {}, ranks {}) is not the "
               "DTensor's (shape {}, ranks {}); redistributing across meshes is not supported",
               mesh.shape(), mesh.ranks(),
               mesh_->shape(),
               mesh_->ranks());
  placements = normalize("DTensor.redistribute", std::move(placements), ndim(), mesh);
  DLayout layout = DTensorAccess::layout(*this);
  Tensor local = redistribute_local(local_, layout, placements);
  layout.placements = std::move(placements);
  return DTensorAccess::make(local, std::move(layout));
}

int64_t DTensor::size(int64_t dim) const {
  STRATA_CHECK(dim >= -ndim() && dim < ndim(), "[DTensor.size] dim {} is out of range for {} dims", dim, ndim());
  return shape_[static_cast<size_t>(dim < 0 ? dim + ndim() : dim)];
}

Strides DTensor::stride() const { return contiguous_strides(shape_); }

int64_t DTensor::numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>());
}

const DTensor& DTensor::requires_grad_(bool requires_grad) const {
  local_.requires_grad_(requires_grad);
  return *this;
}

DTensor DTensor::grad() const {
  const Tensor& g = local_.grad();
  if (!g.defined()) return {};
  return DTensorAccess::make(g, {mesh_, shape_, grad_placements(placements_)});
}

void DTensor::backward() const {
  STRATA_CHECK(numel() == 1, "[DTensor.backward] needs a one-element DTensor (a loss), this one has shape {}",
               shape_);
  // a Shard leaves the ranks past the element an empty piece they cannot start backward from, while
  // the rank holding it may reach a collective: gather it so that every rank starts from a 1
  std::vector<Placement> whole = placements_;
  for (Placement& p : whole)
    if (p.is_shard()) p = Replicate();
  (whole == placements_ ? local_ : redistribute(std::move(whole)).to_local()).backward();
}

DTensor DTensor::detach() const { return DTensorAccess::make(local_.detach(), DTensorAccess::layout(*this)); }

std::string DTensor::str() const {
  if (!defined()) return "DTensor(undefined)";
  return fmt::format("DTensor(shape={}, placements={}, mesh={}, local shape={}, dtype={})", shape_,
                     text(placements_),
                     mesh_->shape(),
                     local_.shape(), dtype_name(local_.dtype()));
}

}  // namespace strata::dist
