// What the distributed tests share: the default MPI process group, created on first use (each
// test binary runs under mpirun, every rank running every test in the same order).
#pragma once

#include <memory>

#include "testing.h"

namespace strata::dist_testing {

inline std::shared_ptr<dist::ProcessGroup> group() {
  if (!dist::is_initialized()) dist::init_process_group("mpi");
  return dist::default_group();
}

// Every rank's copy of `t` equals rank 0's, bit for bit.
inline void expect_same_on_every_rank(dist::ProcessGroup& pg, const Tensor& t) {
  Tensor root = t.detach().clone();
  pg.broadcast(root, 0)->wait();
  EXPECT_TRUE(equal(root, t));
}

// SGD whose update raises at the fail_at-th parameter it updates once `fail` is set: a failure
// inside the wrapped optimizer of a ZeroRedundancyOptimizer after some of its parameters moved.
struct FlakySGD : optim::SGD {
  using optim::SGD::SGD;
  bool fail = false;
  int fail_at = 2;
  int updates = 0;

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, optim::ParamState& state) override {
    if (fail && ++updates == fail_at) throw Error("flaky update");
    optim::SGD::update(group, param, grad, state);
  }
};

}  // namespace strata::dist_testing
