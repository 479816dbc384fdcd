// Shared by the scheduler tests: an SGD optimizer with two groups, and a driver that steps a
// scheduler and checks its lrs against an expected formula.
#pragma once

#include <cmath>
#include <functional>
#include <memory>

#include "testing.h"

namespace strata::testing {

struct Fixture {
  Tensor a = ones({2}), b = ones({3});
  std::unique_ptr<optim::SGD> opt;
  Fixture(double lr0 = 0.05, double lr1 = 0.2) {
    a.requires_grad_();
    b.requires_grad_();
    opt = std::make_unique<optim::SGD>(std::vector<optim::SGD::Group>{
        {{a}, {.lr = lr0, .momentum = 0.9}}, {{b}, {.lr = lr1, .momentum = 0.9}}});
  }
};

// lr_of(epoch, group, previous lr of the group) -> expected lr; the scheduler has made its
// step-0 lr already. Checks get_last_lr() and the optimizer's lrs over `epochs` steps.
inline void expect_schedule(optim::LRScheduler& s, optim::Optimizer& opt, int epochs,
                            const std::function<double(int64_t, size_t, double)>& lr_of, double rtol = 1e-12) {
  std::vector<double> prev = s.base_lrs();
  for (int64_t e = 0; e < epochs; ++e) {
    if (e > 0) s.step();
    ASSERT_EQ(s.last_epoch(), e);
    for (size_t g = 0; g < 2; ++g) {
      double want = lr_of(e, g, prev[g]);
      ASSERT_NEAR(s.get_last_lr()[g], want, rtol * std::fabs(want) + 1e-15) << s.name() << " epoch " << e;
      ASSERT_EQ(opt.lr(g), s.get_last_lr()[g]);
      prev[g] = want;
    }
  }
}

}  // namespace strata::testing
