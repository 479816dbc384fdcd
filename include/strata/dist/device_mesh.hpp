// A device mesh (torch.distributed.device_mesh): the world's ranks arranged row-major in a 1-,
// 2- or 3-D grid with named dims, and the process group along each dim, for combining data,
// tensor and pipeline parallelism.
//
//   auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});   // mpirun -np 4
//   dist::ColumnParallelLinear fc1(64, 256, mesh.get_group("tp"));      // ranks {0,1} and {2,3}
//   dist::DistributedDataParallel ddp(model, {.process_group = mesh.get_group("dp")});
//
// Rank r sits at the coordinate of r in the row-major grid (torch's arange(world).view(shape)).
// Creating a mesh is collective: every rank creates the same one, in the same order as its
// other collectives. Slicing one is not: `mesh["dp"]` or `mesh.slice({"dp", "tp"})` is the
// sub-mesh of the ranks that share this rank's coordinate on the other dims, whose groups are
// the parent's (as torch's mesh["dp"]):
//
//   auto mesh = dist::init_device_mesh("cpu", {2, 2, 2}, {"pp", "dp", "tp"});   // -np 8
//   dist::DeviceMesh dp_tp = mesh.slice({"dp", "tp"});   // this "pp" stage's 2 x 2 ranks
//   dist::DeviceMesh dp = mesh["dp"];                      // 1-D: dp.get_group(), dp.get_local_rank()
//
// Flattening (torch's mesh["dp", "cp"]._flatten()) is collective: a 1-D mesh over the product of
// some dims, with a group of its own; the parent and its slices find it by name afterwards:
//
//   dist::DeviceMesh dp_tp = mesh.slice({"dp", "tp"}).flatten();   // named "dp_tp", 4 ranks
//   mesh["dp_tp"].get_group() == dp_tp.get_group()
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <strata/dist/process_group.hpp>

namespace strata::dist {

class STRATA_API DeviceMesh {
 public:
  /// A mesh over the default group's ranks; `shape` must multiply to its size. `dim_names`,
  /// if given, names every dim, each name once.
  explicit DeviceMesh(std::vector<int> shape, std::vector<std::string> dim_names = {});

  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int>& shape() const { return shape_; }
  /// The number of ranks along `dim`, or in the whole mesh.
  int size(int dim) const;
  int size() const;
  const std::vector<std::string>& mesh_dim_names() const { return dim_names_; }
  /// This rank's coordinate, one index per dim.
  const std::vector<int>& get_coordinate() const { return coordinate_; }
  /// This rank's index along `dim` (its rank in that dim's group).
  int get_local_rank(int dim) const;
  int get_local_rank(const std::string& dim_name) const;
  /// The group of the ranks that share this rank's coordinate on every other dim.
  std::shared_ptr<ProcessGroup> get_group(int dim) const;
  std::shared_ptr<ProcessGroup> get_group(const std::string& dim_name) const;
  /// The global rank at `coordinate`.
  int rank_at(const std::vector<int>& coordinate) const;
  /// This rank's global rank.
  int get_rank() const;
  /// The global ranks of the mesh in row-major order of its coordinates (torch's mesh.mesh.flatten()).
  const std::vector<int>& ranks() const { return ranks_; }
  /// The groups along every dim, in dim order (torch's get_all_groups()).
  const std::vector<std::shared_ptr<ProcessGroup>>& get_all_groups() const { return groups_; }
  /// A 1-D mesh's group and this rank's index in it (torch's get_group() and get_local_rank()
  /// without a dim); raise on a mesh of more dims.
  std::shared_ptr<ProcessGroup> get_group() const;
  int get_local_rank() const;

  /// The sub-mesh over the named dims (named in the mesh's order, each once): the ranks whose
  /// coordinates on the other dims are this rank's, with the parent's groups along the kept dims.
  /// Local: no communication, so ranks may slice differently.
  DeviceMesh slice(const std::vector<std::string>& dim_names) const;
  DeviceMesh operator[](const std::string& dim_name) const { return slice({dim_name}); }

  /// torch's _flatten(): a 1-D mesh over all of this mesh's ranks in row-major order, named
  /// `mesh_dim_name` (default: the dim names joined by "_"), with a new group over them. Collective
  /// over the default group: every rank flattens the same dims of its own slice, in the same
  /// order as its other collectives. The name is recorded on the mesh it was sliced from (and
  /// every slice of that one), so `parent[name]` gives the flattened mesh later; flattening the
  /// same dims under the same name again returns the recorded mesh without communication.
  DeviceMesh flatten(const std::string& mesh_dim_name = "") const;

  /// Same shape, dim names and ranks (as torch's DeviceMesh equality).
  bool operator==(const DeviceMesh& other) const {
    return shape_ == other.shape_ && ranks_ == other.ranks_ && dim_names_ == other.dim_names_;
  }
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }

 private:
  DeviceMesh() = default;
  int dim_index(const std::string& dim_name) const;
  void check_dim(int dim) const;
  /// Root dims of each flattened name, and this rank's flattened mesh by name; shared by a mesh,
  /// its copies and its slices.
  struct Flattened {
    std::vector<std::string> root_dims;  // the dim names of the mesh the others were sliced from
    std::map<std::string, std::vector<std::string>> dims;
    std::map<std::string, std::shared_ptr<DeviceMesh>> meshes;
  };

  std::vector<int> shape_;
  std::vector<int> ranks_;  // row-major
  std::vector<std::string> dim_names_;
  std::vector<int> coordinate_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  std::shared_ptr<Flattened> flattened_ = std::make_shared<Flattened>();
};

/// torch's init_device_mesh: creates the default group first when there is none ("cpu": the
/// mpi backend, "cuda": nccl), then the mesh.
STRATA_API DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int> mesh_shape,
                                       std::vector<std::string> mesh_dim_names = {});

}  // namespace strata::dist
