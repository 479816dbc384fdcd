// Subgroups of the default group (torch.distributed.new_group) and rank translation. A group is
// split from its parent's communicator by the backend (MPI_Comm_split, ncclCommSplit); a rank
// outside it gets a NonMemberGroup, torch's GroupMember.NON_GROUP_MEMBER, which refuses every
// operation.
#include <algorithm>

#include <strata/dist/process_group.hpp>

namespace strata::dist {

namespace {

[[noreturn]] void unreachable() { ::strata::detail::throw_error("[dist] this rank is not a member of the group"); }

class NonMemberGroup final : public ProcessGroup {
 public:
  NonMemberGroup(std::string backend, std::vector<int> global_ranks)
      : backend_(std::move(backend)), global_ranks_(std::move(global_ranks)) {}
  int rank() const override { return -1; }
  int size() const override { return -1; }  // as torch.distributed.get_world_size(group) outside it
  std::string backend() const override { return backend_; }
  std::vector<int> global_ranks() const override { return global_ranks_; }
  bool is_member() const override { return false; }

 protected:
  // The public methods raise before reaching these (ProcessGroup::check_member).
  using Finish = std::function<void()>;
  std::shared_ptr<FutureWork> allreduce_impl(const Tensor&, ReduceOp, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> broadcast_impl(const Tensor&, int, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> allgather_impl(const Tensor&, const Tensor&, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> reduce_scatter_impl(const Tensor&, const Tensor&, ReduceOp, Finish) override {
    unreachable();
  }
  std::shared_ptr<FutureWork> reduce_impl(const Tensor&, int, ReduceOp, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> gather_impl(const Tensor&, const Tensor&, int, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> scatter_impl(const Tensor&, const Tensor&, int, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> alltoall_impl(const Tensor&, const Tensor&, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> alltoallv_impl(const Tensor&, const Tensor&, std::vector<int64_t>, std::vector<int64_t>,
                                             Finish) override {
    unreachable();
  }
  std::shared_ptr<ProcessGroup> split_impl(int, int, std::vector<int>) override { unreachable(); }
  std::shared_ptr<FutureWork> barrier_impl() override { unreachable(); }
  std::shared_ptr<FutureWork> send_impl(const Tensor&, int, int, Finish) override { unreachable(); }
  std::shared_ptr<FutureWork> recv_impl(const Tensor&, int, int, Finish) override { unreachable(); }
  DeviceType device_type() const override { return DeviceType::CPU; }
  int max_tag() const override { return 0; }

 private:
  std::string backend_;
  std::vector<int> global_ranks_;
};

}  // namespace

namespace detail {

std::shared_ptr<ProcessGroup> split_group(ProcessGroup& parent, int color, int key, std::vector<int> global_ranks) {
  STRATA_CHECK(parent.is_member(), "[new_group] this rank is not a member of the parent group");
  parent.check_usable("new_group");
  auto group = parent.split_impl(color, key, global_ranks);
  if (group) return group;
  return std::make_shared<NonMemberGroup>(parent.backend(), std::move(global_ranks));
}

}  // namespace detail

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        std::optional<std::chrono::milliseconds> timeout) {
  auto world = default_group();
  STRATA_CHECK(!timeout || timeout->count() > 0, "[new_group] the timeout must be positive, got {} ms",
               timeout ? timeout->count() : 0);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  STRATA_CHECK(!sorted.empty(), "[new_group] the list of ranks is empty");
  for (int r : sorted)
    STRATA_CHECK(r >= 0 && r < world->size(), "[new_group] rank {} is out of range for a world of {} ranks", r,
                 world->size());
  auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  STRATA_CHECK(twice == sorted.end(), "[new_group] rank {} is listed twice", twice == sorted.end() ? 0 : *twice);
  const bool member = std::binary_search(sorted.begin(), sorted.end(), world->rank());
  // key: the world rank, so group ranks follow the sorted global ranks
  auto group = detail::split_group(*world, member ? 0 : -1, world->rank(), std::move(sorted));
  if (timeout && group->is_member()) group->set_timeout(*timeout);
  return group;
}

int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank) {
  STRATA_CHECK(group != nullptr, "[get_global_rank] the group is null");
  const std::vector<int> ranks = group->global_ranks();
  STRATA_CHECK(group_rank >= 0 && group_rank < static_cast<int>(ranks.size()),
               "[get_global_rank] group rank {} is out of range for a group of {} ranks", group_rank, ranks.size());
  return ranks[static_cast<size_t>(group_rank)];
}

int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank) {
  STRATA_CHECK(group != nullptr, "[get_group_rank] the group is null");
  const std::vector<int> ranks = group->global_ranks();
  auto it = std::find(ranks.begin(), ranks.end(), global_rank);
  STRATA_CHECK(it != ranks.end(), "[get_group_rank] global rank {} is not a member of the group", global_rank);
  return static_cast<int>(it - ranks.begin());
}

}  // namespace strata::dist
