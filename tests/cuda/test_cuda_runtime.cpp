// The CUDA runtime on a real GPU: caching allocator reuse and its out-of-memory error,
// record_stream across two streams, stream ordering with events, pinned non-blocking copies.
// Without a GPU every test is skipped with a message (CTest reports them as skipped).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <strata/strata.hpp>

namespace cuda = strata::cuda;
using strata::Device;
using strata::Tensor;

namespace {

#define SKIP_WITHOUT_GPU()                                                                        \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (or strata built without CUDA)"

Tensor host_iota(int64_t n) {  // 0, 1, 2, ... as float32 on the CPU
  Tensor t = strata::empty({n}, strata::kFloat32);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i);
  return t;
}

}  // namespace

TEST(CudaRuntime, DeviceQueries) {
  SKIP_WITHOUT_GPU();
  EXPECT_GT(cuda::device_count(), 0);
  cuda::DeviceProperties p = cuda::get_device_properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.total_memory, 0);
  EXPECT_GT(p.multiprocessor_count, 0);
  EXPECT_GE(p.major, 3);
  EXPECT_GE(p.shared_memory_per_block_optin, 48 * 1024);  // every GPU since compute capability 3.0
  {
    cuda::DeviceGuard g(0);
    EXPECT_EQ(cuda::current_device(), 0);
  }
  EXPECT_THROW(cuda::DeviceGuard(cuda::device_count()), strata::Error);
}

TEST(CudaRuntime, StreamGuardSetsTheCurrentStream) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::Stream::current(0).is_default());
  cuda::Stream s = cuda::Stream::create(0);
  EXPECT_FALSE(s.is_default());
  {
    cuda::StreamGuard g(s);
    EXPECT_EQ(cuda::Stream::current(0), s);
  }
  EXPECT_TRUE(cuda::Stream::current(0).is_default());
  cuda::Stream hi = cuda::Stream::create(0, -1);
  EXPECT_LE(hi.priority(), s.priority());
}

TEST(CudaRuntime, AllocatorReusesFreedBlocks) {
  SKIP_WITHOUT_GPU();
  cuda::synchronize(0);
  auto before = cuda::memory_stats(0);
  void* first;
  {
    Tensor a = strata::empty({1000}, {strata::kFloat32, Device::cuda(0)});
    first = a.data();
  }
  Tensor b = strata::empty({900}, {strata::kFloat32, Device::cuda(0)});
  EXPECT_EQ(b.data(), first);  // same stream, cached block
  auto after = cuda::memory_stats(0);
  EXPECT_EQ(after.num_allocs - before.num_allocs, 2);
  EXPECT_GE(after.num_cache_hits - before.num_cache_hits, 1);
  EXPECT_LE(after.num_raw_allocs - before.num_raw_allocs, 1);
  EXPECT_EQ(after.allocated_bytes - before.allocated_bytes, 4096);  // 3600 rounded to 512
}

TEST(CudaRuntime, OutOfMemoryStatesTheRequestAndStats) {
  SKIP_WITHOUT_GPU();
  int64_t huge = cuda::get_device_properties(0).total_memory * 2;
  try {
    Tensor t = strata::empty({huge}, {strata::kUInt8, Device::cuda(0)});
    FAIL() << "allocating twice the device memory succeeded";
  } catch (const strata::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("out of memory on cuda:0 allocating {} bytes", huge)), std::string::npos) << m;
    EXPECT_NE(m.find("reserved"), std::string::npos) << m;
  }
  Tensor ok = strata::empty({1024}, {strata::kFloat32, Device::cuda(0)});  // the device still works
  EXPECT_GE(cuda::memory_stats(0).num_ooms, 1);
}

TEST(CudaRuntime, RecordStreamDefersReuseAcrossStreams) {
  SKIP_WITHOUT_GPU();
  cuda::Stream side = cuda::Stream::create(0);
  Tensor big_host = strata::empty({int64_t(128) << 20}, strata::kFloat32).pin_memory();  // 512 MiB
  Tensor big_dev;
  void* first;
  {
    Tensor a = strata::empty({1 << 20}, {strata::kFloat32, Device::cuda(0)});  // on the default stream
    first = a.data();
    cuda::StreamGuard g(side);
    big_dev = big_host.to(Device::cuda(0), true);  // keeps `side` busy for milliseconds
    cuda::record_stream(a, side);
  }  // a freed: an event on `side` now guards its block
  Tensor b = strata::empty({1 << 20}, {strata::kFloat32, Device::cuda(0)});
  EXPECT_NE(b.data(), first);  // the side stream may still be using a's memory
  EXPECT_EQ(cuda::memory_stats(0).num_pending_frees, 1);
  side.synchronize();
  Tensor c = strata::empty({1 << 20}, {strata::kFloat32, Device::cuda(0)});
  EXPECT_EQ(c.data(), first);  // event done: reused
  EXPECT_EQ(cuda::memory_stats(0).num_pending_frees, 0);
}

TEST(CudaRuntime, CopyOnAUserStreamThenEventWait) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 22;
  Tensor host = host_iota(n).pin_memory();
  ASSERT_TRUE(host.is_pinned());
  cuda::Stream s = cuda::Stream::create(0);
  cuda::Event done(true), start(true);
  Tensor dev;
  {
    cuda::StreamGuard g(s);
    start.record();
    dev = host.to(Device::cuda(0), true);  // queued on s
    done.record();
  }
  cuda::Stream::default_stream(0).wait(done);  // default-stream work after this sees the copy
  Tensor back = dev.to(strata::kCPU);          // on the default stream, blocking
  const float* p = back.data_ptr<float>();
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(p[i], static_cast<float>(i));
  EXPECT_TRUE(done.query());
  EXPECT_GE(start.elapsed_time(done), 0.0f);
}

TEST(CudaRuntime, PinnedNonBlockingRoundTrip) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  Tensor host = host_iota(n).pin_memory();
  Tensor dev = host.to(Device::cuda(0), true);
  Tensor back = strata::empty({n}, strata::kFloat32).pin_memory();
  back.copy_(dev, true);
  cuda::Stream::current(0).synchronize();
  EXPECT_EQ(std::memcmp(back.data(), host.data(), static_cast<size_t>(n) * sizeof(float)), 0);
}

// A channels-last tensor keeps its layout across devices, and its bytes move as they are.
TEST(CudaRuntime, ChannelsLastRoundTrip) {
  SKIP_WITHOUT_GPU();
  Tensor host = host_iota(2 * 3 * 4 * 5).reshape({2, 3, 4, 5}).to(strata::MemoryFormat::ChannelsLast);
  for (bool non_blocking : {false, true}) {
    Tensor dev = host.to(Device::cuda(0), non_blocking);
    EXPECT_TRUE(dev.is_contiguous(strata::MemoryFormat::ChannelsLast));
    Tensor back = dev.cpu();
    EXPECT_EQ(back.strides(), host.strides());
    EXPECT_EQ(std::memcmp(back.contiguous().data(), host.contiguous().data(), 120 * sizeof(float)), 0);
  }
}

TEST(CudaRuntime, PinnedBuffersAreCachedAndHeldBackWhileACopyRuns) {
  SKIP_WITHOUT_GPU();
  const int64_t n = int64_t(64) << 20;  // 256 MiB: the copy takes milliseconds
  Tensor dev = strata::empty({n}, {strata::kFloat32, Device::cuda(0)});
  void* first;
  {
    Tensor staging = strata::empty({n}, strata::kFloat32).pin_memory();
    first = staging.data();
    staging.copy_(dev, true);  // D2H still running when `staging` dies
  }
  Tensor again = strata::empty({n}, strata::kFloat32).pin_memory();
  EXPECT_NE(again.data(), first);  // held back: the copy may still write it
  cuda::Stream::current(0).synchronize();
  auto before = strata::pinned_allocator().stats();
  Tensor third = strata::empty({n}, strata::kFloat32).pin_memory();
  EXPECT_EQ(third.data(), first);  // the copy is done: reused without cudaHostAlloc
  EXPECT_EQ(strata::pinned_allocator().stats().num_cache_hits, before.num_cache_hits + 1);
}

// Where no GPU is visible the API still answers: queries say "none", the rest raise Error.
TEST(CudaRuntime, WithoutAGpuEverythingSaysSo) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is visible; this test is for machines without one";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_NO_THROW(cuda::empty_cache());
  EXPECT_THROW(cuda::memory_stats(0), strata::Error);
  EXPECT_THROW(cuda::Stream::create(0), strata::Error);
  EXPECT_THROW(cuda::get_device_properties(0), strata::Error);
  cuda::Event e;
  EXPECT_FALSE(e.is_recorded());
  EXPECT_THROW(strata::empty({4}, Device::cuda(0)), strata::Error);
  Tensor pinned = host_iota(8).pin_memory();  // plain host memory then, same values
  EXPECT_FALSE(pinned.is_pinned());
  EXPECT_EQ(pinned.data_ptr<float>()[7], 7.0f);
}
