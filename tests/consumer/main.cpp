// Built against the installed package by tests/consumer/run.cmake.
#include <cstdio>

#include <strata/strata.hpp>

int main() {
  float v = strata::matmul(strata::ones({64, 32}), strata::ones({32, 16})).sum().item<float>();
  std::printf("strata %s: %g\n", strata::version(), v);
  return v == 32768.0f ? 0 : 1;
}
