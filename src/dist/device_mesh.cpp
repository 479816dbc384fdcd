// DeviceMesh: coordinates in a row-major grid of the world's ranks, and one group per dim, made
// by splitting the default group once per dim (every rank is in exactly one group of each dim).
// A slice keeps some dims: the ranks it holds are those that share this rank's coordinate on the
// dims it drops, and the group along a kept dim is the parent's (the same set of ranks).
#include <strata/dist/device_mesh.hpp>

#include <algorithm>

namespace strata::dist {

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "[" + s + "]";
}

std::string quoted(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s.empty() ? std::string("unnamed") : s;
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<int> shape, std::vector<std::string> dim_names)
    : shape_(std::move(shape)), dim_names_(std::move(dim_names)) {
  auto world = default_group();
  STRATA_CHECK(!shape_.empty() && shape_.size() <= 3, "[DeviceMesh] the mesh has 1, 2 or 3 dims, got shape {}",
               join(shape_));
  int64_t product = 1;
  for (int s : shape_) {
    STRATA_CHECK(s >= 1, "[DeviceMesh] every dim needs at least one rank, got shape {}", join(shape_));
    product *= s;
  }
  STRATA_CHECK(product == world->size(), "[DeviceMesh] shape {} holds {} ranks, the world has {}", join(shape_),
               product, world->size());
  STRATA_CHECK(dim_names_.empty() || dim_names_.size() == shape_.size(),
               "[DeviceMesh] {} dim names given for {} dims", dim_names_.size(), shape_.size());
  for (size_t d = 0; d < dim_names_.size(); ++d) {
    STRATA_CHECK(!dim_names_[d].empty(), "[DeviceMesh] dim {} has an empty name", d);
    STRATA_CHECK(std::count(dim_names_.begin(), dim_names_.end(), dim_names_[d]) == 1,
                 "[DeviceMesh] the dim name '{}' is given twice", dim_names_[d]);
  }
  flattened_->root_dims = dim_names_;
  for (int r = 0; r < world->size(); ++r) ranks_.push_back(r);
  // row-major coordinate of this rank
  coordinate_.assign(shape_.size(), 0);
  for (int d = ndim() - 1, rest = world->rank(); d >= 0; --d) {
    coordinate_[static_cast<size_t>(d)] = rest % shape_[static_cast<size_t>(d)];
    rest /= shape_[static_cast<size_t>(d)];
  }
  for (int d = 0; d < ndim(); ++d) {
    // the group along d: the ranks whose coordinate differs from this one's at d only; its color
    // is the rank at index 0 along d, which every member computes alike
    std::vector<int> at = coordinate_;
    std::vector<int> members;
    for (int i = 0; i < shape_[static_cast<size_t>(d)]; ++i) {
      at[static_cast<size_t>(d)] = i;
      members.push_back(rank_at(at));
    }
    const int color = members.front();
    groups_.push_back(detail::split_group(*world, color, world->rank(), std::move(members)));
  }
}

int DeviceMesh::rank_at(const std::vector<int>& coordinate) const {
  STRATA_CHECK(coordinate.size() == shape_.size(), "[DeviceMesh] a coordinate of {} indices for a {}-dim mesh",
               coordinate.size(), shape_.size());
  int index = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    STRATA_CHECK(coordinate[d] >= 0 && coordinate[d] < shape_[d], "[DeviceMesh] coordinate {} is outside shape {}",
                 join(coordinate), join(shape_));
    index = index * shape_[d] + coordinate[d];
  }
  return ranks_[static_cast<size_t>(index)];
}

int DeviceMesh::get_rank() const { return rank_at(coordinate_); }

std::shared_ptr<ProcessGroup> DeviceMesh::get_group() const {
  STRATA_CHECK(ndim() == 1, "[DeviceMesh] get_group() without a dim needs a 1-D mesh, this one has {} dims", ndim());
  return groups_.front();
}

int DeviceMesh::get_local_rank() const {
  STRATA_CHECK(ndim() == 1, "[DeviceMesh] get_local_rank() without a dim needs a 1-D mesh, this one has {} dims",
               ndim());
  return coordinate_.front();
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& dim_names) const {
  STRATA_CHECK(!dim_names.empty(), "[DeviceMesh] a slice needs at least one dim name");
  if (dim_names.size() == 1 && std::find(dim_names_.begin(), dim_names_.end(), dim_names[0]) == dim_names_.end()) {
    auto flat = flattened_->dims.find(dim_names[0]);
    if (flat != flattened_->dims.end()) {
      for (const std::string& d : flat->second)
        STRATA_CHECK(std::find(dim_names_.begin(), dim_names_.end(), d) != dim_names_.end(),
                     "[DeviceMesh] the flattened dim '{}' spans '{}', which this mesh ({}) does not have",
                     dim_names[0], d, quoted(dim_names_));
      return *flattened_->meshes.at(dim_names[0]);
    }
  }
  std::vector<int> kept;
  for (const std::string& name : dim_names) {
    const int d = dim_index(name);
    STRATA_CHECK(kept.empty() || d > kept.back(),
                 "[DeviceMesh] the slice's dims must be named once each, in the mesh's order ({}), got '{}' after "
                 "'{}'",
                 quoted(dim_names_), name, dim_names_[static_cast<size_t>(kept.back())]);
    kept.push_back(d);
  }
  DeviceMesh sub;
  sub.flattened_ = flattened_;
  for (int d : kept) {
    sub.shape_.push_back(shape_[static_cast<size_t>(d)]);
    sub.dim_names_.push_back(dim_names_[static_cast<size_t>(d)]);
    sub.coordinate_.push_back(coordinate_[static_cast<size_t>(d)]);
    sub.groups_.push_back(groups_[static_cast<size_t>(d)]);
  }
  // the kept dims' coordinates, row-major, with the dropped ones fixed at this rank's
  std::vector<int> at = coordinate_;
  const int count = sub.size();
  for (int index = 0; index < count; ++index) {
    for (int k = static_cast<int>(kept.size()) - 1, rest = index; k >= 0; --k) {
      const int d = kept[static_cast<size_t>(k)];
      at[static_cast<size_t>(d)] = rest % shape_[static_cast<size_t>(d)];
      rest /= shape_[static_cast<size_t>(d)];
    }
    sub.ranks_.push_back(rank_at(at));
  }
  return sub;
}

// Note [Flattened meshes]: the new group is split from the default group, so every rank of the
// world takes part; ranks in one slice share its first rank as color and are ordered by their
// row-major index. The result is recorded in the registry this mesh shares with its parent.
DeviceMesh DeviceMesh::flatten(const std::string& mesh_dim_name) const {
  std::string name = mesh_dim_name;
  if (name.empty()) {
    STRATA_CHECK(!dim_names_.empty(), "[DeviceMesh] flatten() of a mesh without dim names needs a name");
    for (const std::string& d : dim_names_) name += (name.empty() ? "" : "_") + d;
  }
  // the dims of the mesh this one was sliced from too: mesh[name] must keep meaning that dim
  const auto& root = flattened_->root_dims;
  STRATA_CHECK(std::find(dim_names_.begin(), dim_names_.end(), name) == dim_names_.end() &&
                   std::find(root.begin(), root.end(), name) == root.end(),
               "[DeviceMesh] cannot flatten into '{}': the mesh already has a dim of that name ({})", name,
               quoted(root.empty() ? dim_names_ : root));
  auto known = flattened_->dims.find(name);
  if (known != flattened_->dims.end()) {
    STRATA_CHECK(known->second == dim_names_,
                 "[DeviceMesh] '{}' already names the flattened dims {}, cannot flatten {} under it", name,
                 quoted(known->second), quoted(dim_names_));
    return *flattened_->meshes.at(name);
  }
  auto world = default_group();
  const int me = get_rank();
  const auto index = std::find(ranks_.begin(), ranks_.end(), me) - ranks_.begin();
  DeviceMesh flat;
  flat.shape_ = {size()};
  flat.ranks_ = ranks_;
  flat.dim_names_ = {name};
  flat.coordinate_ = {static_cast<int>(index)};
  flat.groups_.push_back(detail::split_group(*world, ranks_.front(), static_cast<int>(index), ranks_));
  if (!dim_names_.empty()) {
    flattened_->dims[name] = dim_names_;
    flattened_->meshes[name] = std::make_shared<DeviceMesh>(flat);
  }
  return flat;
}

void DeviceMesh::check_dim(int dim) const {
  STRATA_CHECK(dim >= 0 && dim < ndim(), "[DeviceMesh] dim {} is out of range for a {}-dim mesh", dim, ndim());
}

int DeviceMesh::dim_index(const std::string& dim_name) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), dim_name);
  STRATA_CHECK(it != dim_names_.end(), "[DeviceMesh] no dim named '{}' (the mesh's dims: {})", dim_name,
               quoted(dim_names_));
  return static_cast<int>(it - dim_names_.begin());
}

int DeviceMesh::size(int dim) const {
  check_dim(dim);
  return shape_[static_cast<size_t>(dim)];
}

int DeviceMesh::size() const {
  int n = 1;
  for (int s : shape_) n *= s;
  return n;
}

int DeviceMesh::get_local_rank(int dim) const {
  check_dim(dim);
  return coordinate_[static_cast<size_t>(dim)];
}

int DeviceMesh::get_local_rank(const std::string& dim_name) const { return get_local_rank(dim_index(dim_name)); }

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(int dim) const {
  check_dim(dim);
  return groups_[static_cast<size_t>(dim)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(const std::string& dim_name) const {
  return get_group(dim_index(dim_name));
}

DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int> mesh_shape,
                            std::vector<std::string> mesh_dim_names) {
  STRATA_CHECK(device_type == "cpu" || device_type == "cuda",
               "[init_device_mesh] unknown device type '{}': expected 'cpu' or 'cuda'", device_type);
  const std::string backend = device_type == "cpu" ? "mpi" : "nccl";
  if (!is_initialized()) init_process_group(backend);
  STRATA_CHECK(default_group()->backend() == backend,
               "[init_device_mesh] a '{}' mesh needs the {} backend, the default group uses {}", device_type, backend,
               default_group()->backend());
  return DeviceMesh(std::move(mesh_shape), std::move(mesh_dim_names));
}

}  // namespace strata::dist
