// Tensors of more than 2^31 elements: 64-bit index arithmetic in views, copies, fills and
// elementwise kernels.
#include "testing.h"

using namespace strata;

TEST(Large, MoreThanTwoToThe31Elements) {
  const int64_t n = (int64_t(1) << 31) + 100;
  Tensor x = zeros({n}, kUInt8);
  EXPECT_EQ(x.numel(), n);
  // write past 2^31 through a view and read it back
  x.narrow(0, n - 3, 3).fill_(7);
  EXPECT_EQ(x[n - 1].item<int>(), 7);
  EXPECT_EQ(x[n - 4].item<int>(), 0);
  EXPECT_EQ(x[(int64_t(1) << 31) + 1].item<int>(), 0);
  // an elementwise kernel over the whole range, through a 2-d strided view
  Tensor y = x.view({2, n / 2}).t() + 1;  // (n/2, 2), non-contiguous input
  EXPECT_EQ(y.shape(), (Shape{n / 2, 2}));
  EXPECT_EQ(y[n / 2 - 1][1].item<int>(), 8);
  EXPECT_EQ(y[n / 2 - 1][0].item<int>(), 1);
  EXPECT_EQ(y[0][0].item<int>(), 1);
}
