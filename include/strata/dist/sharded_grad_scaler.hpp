// ShardedGradScaler, as torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler: an
// amp::GradScaler whose inf/NaN verdict is all-reduced (max) over a process group before step()
// decides and update() changes the scale, so every rank skips or steps together and the scales
// stay equal. Needed wherever each rank sees only part of the gradients: FullyShardedDataParallel
// (each rank holds its shards' gradients) and a ZeroRedundancyOptimizer without DDP.
//
//   dist::ShardedGradScaler scaler;           // the default process group
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);                     // optional, to clip: fsdp.clip_grad_norm_(1.0)
//   scaler.step(opt);                         // collective: every rank calls it
//   scaler.update();                          // collective when no step() read the verdict
//
// Its state_dict() is a GradScaler's (type "GradScaler"): the two load each other's.
#pragma once

#include <memory>

#include <strata/amp/grad_scaler.hpp>
#include <strata/dist/process_group.hpp>

namespace strata::dist {

class STRATA_API ShardedGradScaler : public amp::GradScaler {
 public:
  /// Over `process_group`, or the default group when null; this rank must be a member.
  explicit ShardedGradScaler(amp::GradScalerOptions options = {},
                             std::shared_ptr<ProcessGroup> process_group = nullptr);

  std::shared_ptr<ProcessGroup> process_group() const { return group_; }

 protected:
  /// Whether any rank found an inf or NaN: one allreduce (max) of a flag on the scale's device.
  bool agree_on_found_inf(bool local_found_inf, Device device) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace strata::dist
