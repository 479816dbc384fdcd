#include "testing.h"
using namespace strata;
TEST(Elementwise, Smoke) {
  Tensor a = arange(6, kFloat32).view({2, 3});
  Tensor b = a.t() * 2.0 + 1;
  EXPECT_EQ(b.shape(), (Shape{3, 2}));
  EXPECT_TRUE(strata::testing::all_close(b, {1, 7, 3, 9, 5, 11}, 0, 0));
  fmt::print("{}\n{}\n", a, exp(a));
}
