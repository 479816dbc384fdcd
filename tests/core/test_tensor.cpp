// Tensor basics: factories, views and their bounds, dtype conversion, printing, the registry.
#include <limits>

#include "testing.h"

using namespace strata;
using strata::testing::values;

TEST(Tensor, ConsumerExpression) {
  EXPECT_EQ(strata::matmul(strata::ones({64, 32}), strata::ones({32, 16})).sum().item<float>(), 32768.0f);
}
