// ZeroRedundancyOptimizer's type-independent part: PyTorch's greedy partition, the broadcast
// of updated parameters from their owners, the agreement on errors (so a rank that raises never
// leaves the others waiting in a collective), and the state dict exchange. A state dict moves to
// the consolidating rank as one int64 record list (each entry's kind, global parameter index,
// name, and scalar value or tensor dtype and shape) followed by the tensors, with send/recv.
#include <strata/dist/zero.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "dist/model_sync.h"
#include "dist/working_copy.h"
#include "optim/state_keys.h"

namespace strata::dist::detail {

namespace {

using optim::detail::parse_state_key;
using optim::detail::state_key;

enum Kind : int64_t { kScalar = 0, kTensor = 1 };

void put_name(std::vector<int64_t>& rec, const std::string& name) {
  rec.push_back(static_cast<int64_t>(name.size()));
  for (char c : name) rec.push_back(static_cast<unsigned char>(c));
}

}  // namespace

ZeroShards::ZeroShards(const ZeroOptions& options)
    : group_(detail::group_or_default(options.process_group)),
      bucket_bytes_(static_cast<size_t>(std::max(options.broadcast_bucket_mb, 0.0) * 1024 * 1024)) {
  STRATA_CHECK(group_->is_member(), "[ZeroRedundancyOptimizer] this rank is not a member of the process group");
  STRATA_CHECK(options.broadcast_bucket_mb > 0,
               "[ZeroRedundancyOptimizer] broadcast_bucket_mb must be positive, got {}", options.broadcast_bucket_mb);
  numel_per_rank_.assign(static_cast<size_t>(group_->size()), 0);
}

void ZeroShards::assign(const std::vector<std::vector<Tensor>>& groups) {
  for (size_t g = params_.size(); g < groups.size(); ++g) {
    const std::vector<Tensor>& ps = groups[g];
    std::vector<size_t> order(ps.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ps[a].numel() > ps[b].numel(); });
    std::vector<int> owners(ps.size());
    for (size_t k : order) {
      const auto least = std::min_element(numel_per_rank_.begin(), numel_per_rank_.end());
      owners[k] = static_cast<int>(least - numel_per_rank_.begin());
      *least += ps[k].numel();
    }
    for (size_t k = 0; k < ps.size(); ++k) {
      global_index_.emplace(ps[k].impl_ptr().get(), owner_.size());
      const bool mine = owners[k] == group_->rank();
      local_of_global_.push_back(mine ? static_cast<int64_t>(local_to_global_.size()) : -1);
      if (mine) local_to_global_.push_back(owner_.size());
      owner_.push_back(owners[k]);
    }
    params_.push_back(ps);
  }
}

std::vector<std::vector<Tensor>> ZeroShards::local_groups() const {
  std::vector<std::vector<Tensor>> mine(params_.size());
  size_t index = 0;
  for (size_t g = 0; g < params_.size(); ++g)
    for (const Tensor& p : params_[g])
      if (owner_[index++] == group_->rank()) mine[g].push_back(p);
  return mine;
}

void ZeroShards::check_grads(const std::string& name) const {
  size_t index = 0;
  for (const auto& ps : params_)
    for (const Tensor& p : ps) {
      const Tensor& grad = p.grad();
      STRATA_CHECK(!grad.defined() || (grad.shape() == p.shape() && grad.dtype() == p.dtype() &&
                                       grad.device() == p.device()),
                   "[ZeroRedundancyOptimizer] {}: the grad of parameter {} is {} {} on {}, but the parameter is {} {} "
                   "on {}",
                   name, index, grad.shape(), grad.dtype(), grad.device(), p.shape(), p.dtype(), p.device());
      ++index;
    }
}

void ZeroShards::start_broadcast(std::vector<Tensor> params, int owner) {
  NoGradGuard no_grad;
  int64_t numel = 0;
  for (const Tensor& p : params) numel += p.numel();
  const bool sending = group_->rank() == owner;
  std::vector<Tensor> flat_parts;
  if (sending)
    for (const Tensor& p : params) flat_parts.push_back(p.detach().reshape({-1}));
  Tensor flat = sending ? cat(flat_parts, 0) : empty({numel}, params.front().options());
  in_flight_.push_back({group_->broadcast(flat, owner), flat, sending ? std::vector<Tensor>{} : std::move(params)});
}

void ZeroShards::finish_broadcasts() {
  NoGradGuard no_grad;
  std::vector<Broadcast> started = std::move(in_flight_);
  in_flight_.clear();
  for (Broadcast& b : started) {
    b.work->wait();
    int64_t offset = 0;
    for (const Tensor& p : b.params) {
      p.detach().copy_(b.flat.narrow(0, offset, p.numel()).view(p.shape()));
      offset += p.numel();
    }
  }
}

void ZeroShards::start_broadcasts(const std::vector<Tensor>& params) {
  for (int owner = 0; owner < group_->size(); ++owner) {
    std::vector<Tensor> owned;
    for (const Tensor& p : params) {
      auto it = global_index_.find(p.impl_ptr().get());
      if (it != global_index_.end() && owner_[it->second] == owner) owned.push_back(p);
    }
    if (!owned.empty()) start_broadcast(std::move(owned), owner);
  }
}

void ZeroShards::broadcast_params() {
  std::vector<Tensor> bucket;
  size_t bytes = 0;
  int owner = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    start_broadcast(std::exchange(bucket, {}), owner);
    finish_broadcasts();
    bytes = 0;
  };
  for (owner = 0; owner < group_->size(); ++owner) {
    size_t index = 0;
    for (const auto& ps : params_)
      for (const Tensor& p : ps) {
        if (owner_[index++] != owner) continue;
        const Tensor& head = bucket.empty() ? p : bucket.front();
        const bool fits = bucket.empty() || (p.dtype() == head.dtype() && p.device() == head.device() &&
                                             bytes + p.nbytes() <= bucket_bytes_);
        if (!fits) flush();
        bucket.push_back(p);
        bytes += p.nbytes();
      }
    flush();
  }
}

void ZeroShards::agree(std::exception_ptr error, const char* what) const {
  agree_on_error(*group_, std::move(error), params_device(), "ZeroRedundancyOptimizer", what);
}

Device ZeroShards::params_device() const {
  for (const auto& ps : params_)
    if (!ps.empty()) return ps.front().device();
  return kCPU;
}

optim::StateDict ZeroShards::gather_state(const optim::StateDict* local, int to) const {
  const Device device = params_device();
  const int rank = group_->rank();
  // this rank's entries under global indices, in record order
  std::vector<int64_t> records;
  std::vector<Tensor> tensors;
  optim::StateDict mine;
  if (local) {
    size_t li = 0;
    std::string name;
    for (const auto& [key, v] : local->scalars) {
      if (!parse_state_key(key, li, name)) continue;  // the groups' entries are made on `to`
      const size_t gi = local_to_global_.at(li);
      mine.scalars[state_key(gi, name)] = v;
      int64_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      records.insert(records.end(), {kScalar, static_cast<int64_t>(gi)});
      put_name(records, name);
      records.push_back(bits);
    }
    for (const auto& [key, t] : local->tensors) {
      STRATA_CHECK(parse_state_key(key, li, name), "[ZeroRedundancyOptimizer] unexpected state entry '{}'", key);
      const size_t gi = local_to_global_.at(li);
      mine.tensors[state_key(gi, name)] = t;
      records.insert(records.end(), {kTensor, static_cast<int64_t>(gi)});
      put_name(records, name);
      records.insert(records.end(), {static_cast<int64_t>(t.dtype()), t.dim()});
      for (int64_t d = 0; d < t.dim(); ++d) records.push_back(t.size(d));
      tensors.push_back(t.contiguous());
    }
  }
  if (rank != to) {
    std::vector<std::shared_ptr<Work>> sends;
    Tensor length = full({1}, static_cast<int64_t>(records.size()), TensorOptions(kInt64, device));
    sends.push_back(group_->send(length, to));
    if (!records.empty()) sends.push_back(group_->send(from_vector(records).to(device), to));
    for (const Tensor& t : tensors) sends.push_back(group_->send(t, to));
    for (auto& w : sends) w->wait();
    return {};
  }
  for (int src = 0; src < group_->size(); ++src) {
    if (src == to) continue;
    Tensor length = empty({1}, TensorOptions(kInt64, device));
    group_->recv(length, src)->wait();
    const int64_t n = length.cpu().item<int64_t>();
    if (n == 0) continue;
    Tensor rec_t = empty({n}, TensorOptions(kInt64, device));
    group_->recv(rec_t, src)->wait();
    rec_t = rec_t.cpu();
    const int64_t* r = rec_t.data_ptr<int64_t>();
    for (int64_t k = 0; k < n;) {
      const int64_t kind = r[k], gi = r[k + 1], len = r[k + 2];
      std::string name;
      for (int64_t c = 0; c < len; ++c) name.push_back(static_cast<char>(r[k + 3 + c]));
      k += 3 + len;
      const std::string key = state_key(static_cast<size_t>(gi), name);
      if (kind == kScalar) {
        double v = 0;
        std::memcpy(&v, &r[k++], sizeof v);
        mine.scalars[key] = v;
        continue;
      }
      const auto dtype = static_cast<DType>(r[k]);
      Shape shape(r + k + 2, r + k + 2 + r[k + 1]);
      k += 2 + r[k + 1];
      Tensor t = empty(shape, TensorOptions(dtype, device));
      group_->recv(t, src)->wait();
      mine.tensors[key] = t;
    }
  }
  return mine;
}

optim::StateDict ZeroShards::local_dict(const optim::StateDict& full) const {
  optim::StateDict out;
  out.type = full.type;
  size_t gi = 0;
  std::string entry;
  auto local_key = [&](const std::string& key) -> std::optional<std::string> {
    STRATA_CHECK(parse_state_key(key, gi, entry) && gi < owner_.size(),
                 "[ZeroRedundancyOptimizer] load_state_dict: unexpected entry '{}' in the state dict", key);
    if (local_of_global_[gi] < 0) return std::nullopt;
    return state_key(static_cast<size_t>(local_of_global_[gi]), entry);
  };
  for (const auto& [key, v] : full.scalars) {
    if (key.rfind("state.", 0) != 0) {
      out.scalars[key] = v;  // the groups' hyperparameters, the same on every rank
    } else if (auto k = local_key(key)) {
      out.scalars[*k] = v;
    }
  }
  for (const auto& [key, t] : full.tensors)
    if (auto k = local_key(key)) out.tensors[*k] = t;
  const std::vector<std::vector<Tensor>> mine = local_groups();
  for (size_t g = 0; g < mine.size(); ++g)
    out.scalars[fmt::format("group.{}.num_params", g)] = static_cast<double>(mine[g].size());
  return out;
}

optim::StateDict without_states(const optim::StateDict& dict) {
  optim::StateDict groups;
  groups.type = dict.type;
  for (const auto& [key, v] : dict.scalars)
    if (key.rfind("state.", 0) != 0) groups.scalars[key] = v;
  return groups;
}

}  // namespace strata::dist::detail
