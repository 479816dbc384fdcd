// ShardedGradScaler: GradScaler's stages and update rule, with the verdict agreed over the group.
#include <strata/dist/sharded_grad_scaler.hpp>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

#include "dist/working_copy.h"

namespace strata::dist {

ShardedGradScaler::ShardedGradScaler(amp::GradScalerOptions options, std::shared_ptr<ProcessGroup> process_group)
    : amp::GradScaler(options), group_(detail::group_or_default(std::move(process_group))) {
  STRATA_CHECK(group_->is_member(), "[ShardedGradScaler] this rank is not a member of the process group");
}

bool ShardedGradScaler::agree_on_found_inf(bool local_found_inf, Device device) {
  if (group_->size() == 1) return local_found_inf;
  NoGradGuard no_grad;
  Tensor flag = full({1}, local_found_inf ? 1.0 : 0.0, TensorOptions(kFloat32, device));
  group_->allreduce(flag, ReduceOp::Max)->wait();
  return flag.cpu().item<float>() > 0;
}

}  // namespace strata::dist
