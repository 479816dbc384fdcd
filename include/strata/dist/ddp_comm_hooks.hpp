// Built-in DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks): plain
// averaging, half-precision compression, and PowerSGD's low-rank compression.
//
//   dist::DistributedDataParallel ddp(net);
//   ddp.register_comm_hook(nullptr, dist::ddp_comm_hooks::bf16_compress_hook);   // DDP's group
//   // or:
//   auto state = std::make_shared<dist::ddp_comm_hooks::PowerSGDState>(
//       nullptr, dist::ddp_comm_hooks::PowerSGDOptions{.matrix_approximation_rank = 2, .start_powerSGD_iter = 10});
//   ddp.register_comm_hook(state, dist::ddp_comm_hooks::powerSGD_hook);
//
// Each hook works through the process group on the bucket's device, so the same hook runs on
// the MPI (CPU) and NCCL (CUDA) backends. docs/distributed.md ("Communication hooks").
#pragma once

#include <map>
#include <memory>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/dist/comm_hook.hpp>

namespace strata::dist::ddp_comm_hooks {

/// The average over `group`'s ranks, as DDP reduces without a hook (bit for bit the same).
STRATA_API CommFuture allreduce_hook(ProcessGroup& group, GradBucket& bucket);
/// Casts the buffer to float16, divides it by the world size, sums it over the ranks (the sum
/// is taken in float32 and rounded once, Note [Half reductions]) and casts the result back.
STRATA_API CommFuture fp16_compress_hook(ProcessGroup& group, GradBucket& bucket);
/// The same with bfloat16.
STRATA_API CommFuture bf16_compress_hook(ProcessGroup& group, GradBucket& bucket);

namespace detail {
/// Runs `inner` on a copy of `bucket` whose buffer is cast to `dtype`, and casts its result back
/// into bucket.buffer.
STRATA_API CommFuture compress_wrapped(GradBucket& bucket, DType dtype,
                                       const std::function<CommFuture(GradBucket&)>& inner);
}  // namespace detail

/// Wraps another hook (of any state) so that it sees the bucket's buffer in float16 and its
/// result is cast back (torch's fp16_compress_wrapper), e.g. around powerSGD_hook.
template <class Hook> auto fp16_compress_wrapper(Hook hook) {
  return [hook = std::move(hook)](auto& state, GradBucket& bucket) mutable -> CommFuture {
    return detail::compress_wrapped(bucket, kFloat16, [&](GradBucket& b) { return CommFuture(hook(state, b)); });
  };
}
/// The same with bfloat16 (torch's bf16_compress_wrapper).
template <class Hook> auto bf16_compress_wrapper(Hook hook) {
  return [hook = std::move(hook)](auto& state, GradBucket& bucket) mutable -> CommFuture {
    return detail::compress_wrapped(bucket, kBFloat16, [&](GradBucket& b) { return CommFuture(hook(state, b)); });
  };
}

/// PowerSGD's settings, with torch's names and defaults.
struct PowerSGDOptions {
  /// r: each compressed gradient, seen as an n x m matrix, is sent as P (n x r) and Q (m x r).
  int64_t matrix_approximation_rank = 1;
  /// The first iterations (backward passes) reduce with a plain allreduce, as warm-up.
  int64_t start_powerSGD_iter = 1000;
  /// A matrix is compressed only when (n + m) * r * min_compression_rate < n * m; the others
  /// (and every 1-d gradient) are averaged uncompressed.
  double min_compression_rate = 2;
  /// Adds the last step's local compression error to the gradient before compressing it.
  bool use_error_feedback = true;
  /// Starts each step's power iteration from the last step's Q (else from a new random one).
  bool warm_start = true;
  /// Added to a column's norm before it is divided by it (0: none; a zero column then gives NaN,
  /// as in torch).
  double orthogonalization_epsilon = 0;
  /// Seeds the random initial Qs, the same on every rank.
  uint64_t random_seed = 0;
};

/// PowerSGD's state (torch's PowerSGDState): the settings and what persists between steps, per
/// bucket index. Keep the shared_ptr registered with the hook to read or save it.
struct STRATA_API PowerSGDState {
  /// `process_group` null: the default group.
  explicit PowerSGDState(std::shared_ptr<ProcessGroup> process_group, PowerSGDOptions options = {});

  std::shared_ptr<ProcessGroup> process_group;
  PowerSGDOptions options;
  /// Backward passes reduced so far (counted at each last bucket).
  int64_t iter = 0;
  std::map<size_t, Tensor> error_dict;     // per bucket: the local error fed back next step
  std::map<size_t, Tensor> p_memory_dict;  // per bucket: the Ps, end to end
  std::map<size_t, Tensor> q_memory_dict;  // per bucket: the Qs, end to end (the warm start)
  Generator rng;                           // draws the random Qs
  /// Elements the compressed gradients had, and sent, since the start (compression statistics).
  int64_t total_numel_before_compression = 0;
  int64_t total_numel_after_compression = 0;

  /// before / after, as torch's compression_stats() (0 before any compression).
  double compression_rate() const;
  /// What resumes the state exactly (iter, the generator, the error and P/Q memories) as
  /// tensors named "iter", "rng", "error.<bucket>", "p.<bucket>", "q.<bucket>", each a copy.
  std::map<std::string, Tensor> state_dict() const;
  /// Restores a state_dict; the settings and the group are kept. Raises, changing nothing, on an
  /// unknown or missing key.
  void load_state_dict(const std::map<std::string, Tensor>& dict);
};

/// PowerSGD (Vogels et al., 2019), as torch's powerSGD_hook: before start_powerSGD_iter, a plain
/// average; after, each compressible gradient M (n x m, plus its fed-back error) is reduced as
/// P = M Q, P summed and orthonormalized (Gram-Schmidt), Q = M^T P, Q averaged, M' = P Q^T; the
/// other gradients are averaged uncompressed in one allreduce.
STRATA_API CommFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace strata::dist::ddp_comm_hooks
