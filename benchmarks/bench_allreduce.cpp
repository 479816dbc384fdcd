// Allreduce through strata's MPI process group beside a direct MPI_Allreduce on the same
// buffers, float32, from 4 KiB to 64 MiB, as nccl-tests prints it: time per call (median of
// the repetitions), algorithm bandwidth (bytes / time) and bus bandwidth (algbw * 2(n-1)/n,
// what each rank's link carries in a ring). The ratio shows the cost of the communication
// thread and the lock (Note [MPI threads]). Run: mpirun -np 2 ./bench_allreduce [repetitions]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <strata/strata.hpp>

namespace {

template <class F> double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  dist::init_process_group("mpi");  // initializes MPI (MPI_THREAD_SERIALIZED)
  auto pg = dist::default_group();
  const int n = pg->size();
  if (pg->rank() == 0)
    std::printf("%d ranks, float32, median of %d\n%10s %12s %12s %12s %12s %8s\n", n, reps, "bytes", "strata us",
                "MPI us", "algbw GB/s", "busbw GB/s", "ratio");
  for (int64_t elems = 1024; elems <= (int64_t{1} << 24); elems *= 4) {
    Tensor t = ones({elems}, TensorOptions(kFloat32));
    dist::barrier();
    const double ours = median_seconds(reps, [&] { pg->allreduce(t, dist::ReduceOp::Sum)->wait(); });
    dist::barrier();  // the communication thread is idle from here: direct MPI calls are serialized
    const double direct = median_seconds(reps, [&] {
      MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(elems), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double bytes = static_cast<double>(elems) * 4;
    if (pg->rank() == 0)
      std::printf("%10.0f %12.1f %12.1f %12.2f %12.2f %8.2f\n", bytes, ours * 1e6, direct * 1e6, bytes / ours / 1e9,
                  bytes / ours / 1e9 * 2.0 * (n - 1) / n, direct / ours);
  }
  return 0;
}
