// The profiler on a GPU: ops on CUDA tensors get device times from CUDA events recorded on the
// op's stream, in the order the stream ran them, within the host's trace; NVTX ranges on.
#include "cuda/cuda_testing.h"

namespace st = strata;
namespace prof = strata::profiler;
using strata::Tensor;

TEST(CudaProfiler, OpsOnCudaTensorsHaveOrderedDeviceTimes) {
  SKIP_WITHOUT_GPU();
  const st::Device gpu = st::Device::cuda();
  Tensor a = st::randn({256, 256}).to(gpu), b = st::randn({256, 256}).to(gpu);
  st::cuda::synchronize();
  prof::Profiler p({.activities = {prof::ProfilerActivity::CPU, prof::ProfilerActivity::CUDA},
                    .with_flops = true, .emit_nvtx = true});
  {
    prof::ProfileScope scope(p);
    STRATA_RECORD_FUNCTION("gpu work");
    Tensor c = st::matmul(a, b);
    Tensor d = st::exp(c);
    Tensor e = d + c;
    st::cuda::synchronize();
  }
  std::vector<const prof::ProfilerEvent*> ops;
  for (const auto& e : p.events())
    if (e.kind == prof::EventKind::Op) ops.push_back(&e);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0]->name, "matmul");
  EXPECT_DOUBLE_EQ(ops[0]->flops, 2.0 * 256 * 256 * 256);
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& e = *ops[i];
    EXPECT_EQ(e.device, gpu);
    ASSERT_TRUE(e.has_device_time()) << e.name;
    EXPECT_GE(e.device_start_ns, 0) << e.name;
    EXPECT_LE(e.device_start_ns, e.device_end_ns) << e.name;
    // a kernel cannot start on the device before the host launched it
    EXPECT_GE(e.device_start_ns + 50'000, e.start_ns) << e.name;  // 50 us for the two clocks' offset
    if (i > 0) EXPECT_GE(e.device_start_ns, ops[i - 1]->device_end_ns) << e.name << " after " << ops[i - 1]->name;
  }
  EXPECT_GT(p.key_averages().at("matmul").device_time_total_ns, 0);
  EXPECT_NE(p.key_averages().table().find("CUDA total"), std::string::npos);
}

TEST(CudaProfiler, WithoutTheCudaActivityNoDeviceTimes) {
  SKIP_WITHOUT_GPU();
  Tensor a = st::randn({64}).to(st::Device::cuda());
  prof::Profiler p;
  {
    prof::ProfileScope scope(p);
    st::exp(a);
  }
  ASSERT_EQ(p.events().size(), 1u);
  EXPECT_FALSE(p.events()[0].has_device_time());
}
