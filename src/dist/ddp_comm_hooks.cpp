// The default communication hooks: plain averaging and half-precision compression, as
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks.
#include <strata/dist/ddp_comm_hooks.hpp>

namespace strata::dist::ddp_comm_hooks {

namespace {

// The buffer's future value: `result` (a reduction of a copy of it) written back into it.
CommFuture written_back(const Tensor& buffer, const CommFuture& result, const char* hook) {
  return result.then([buffer, hook](const Tensor& value) {
    STRATA_CHECK(value.defined() && value.numel() == buffer.numel(),
                 "[{}] the wrapped hook's future holds {} elements, expected the bucket's {}", hook,
                 value.defined() ? value.numel() : 0, buffer.numel());
    buffer.copy_(value.reshape({buffer.numel()}));
    return buffer;
  });
}

CommFuture compress_hook(ProcessGroup& group, GradBucket& bucket, DType dtype, const char* hook) {
  // divided before the sum, as torch does, so a float16 sum cannot overflow where the average would not
  Tensor compressed = bucket.buffer.to(dtype).clone();
  compressed.div_(group.size());
  return written_back(bucket.buffer, CommFuture(compressed, group.allreduce(compressed, ReduceOp::Sum)), hook);
}

}  // namespace

CommFuture allreduce_hook(ProcessGroup& group, GradBucket& bucket) {
  return CommFuture(bucket.buffer, group.allreduce(bucket.buffer, ReduceOp::Avg));
}

CommFuture fp16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, kFloat16, "fp16_compress_hook");
}

CommFuture bf16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, kBFloat16, "bf16_compress_hook");
}

CommFuture detail::compress_wrapped(GradBucket& bucket, DType dtype,
                                    const std::function<CommFuture(GradBucket&)>& inner) {
  GradBucket compressed = bucket;
  compressed.buffer = bucket.buffer.to(dtype).clone();
  CommFuture result = inner(compressed);
  STRATA_CHECK(result.defined(), "[compress_wrapper] the wrapped hook returned an empty future");
  return written_back(bucket.buffer, result, "compress_wrapper");
}

}  // namespace strata::dist::ddp_comm_hooks
