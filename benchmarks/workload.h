// The workloads every library in the benchmark table runs, described in plain terms so a
// peer library (LibTorch) can be compiled apart from strata.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bench {

enum class Op {
  Matmul,       // (m, k) x (k, n), fp32
  MatmulNT,     // (m, k) x (n, k)^T: a Linear layer's weight, read transposed
  BatchedNT,    // (b, m, k) x (b, n, k)^T: attention scores
  Add, Mul,     // out = a op b, 16M fp32 each
  AddInPlace,   // a += b
  Exp, Gelu,    // out = f(a)
  SumAll,       // sum of a (rows, cols)
  SumDim0,      // sum over dim 0 of (rows, cols)
  SumDim1,      // sum over dim 1 of (rows, cols)
};

struct Workload {
  Op op;
  int64_t b = 1, m = 0, n = 0, k = 0;  // elementwise ops use n; reductions use m (rows) x n (cols)
};

/// Allocates a workload's inputs and returns the function that runs one iteration; the
/// inputs live as long as the returned function.
using Runner = std::function<void()>;

/// A library run beside strata.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  virtual void set_threads(int n) = 0;
  /// Null when the peer has no equivalent of the workload.
  virtual Runner prepare(const Workload& w) = 0;
};

/// LibTorch when the benchmarks were built with it, else null.
std::unique_ptr<Peer> make_torch_peer();

}  // namespace bench
