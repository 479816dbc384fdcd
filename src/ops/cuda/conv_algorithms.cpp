// The cuDNN convolution algorithm cache and the two ways of filling it (heuristics, timed
// search); see conv_algorithms.h.
//
// Note [Convolution math]
// float32 runs with CUDNN_FMA_MATH (true float32) unless allow_tf32() is on, when it runs with
// the math type cuDNN reports for the algorithm (TF32 tensor cores where cuDNN picks them).
// Candidates that would convert float32 data to float16 (TENSOR_OP_MATH_ALLOW_CONVERSION) are
// never used. float16 and bfloat16 run on tensor cores with float32 accumulation (the
// descriptor's compute type is float32); float64 with the default math. cuDNN picks kernels
// by algorithm and math type together, so each candidate carries its math type, which is set
// on the convolution descriptor before it runs.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include <strata/core/cuda.hpp>
#include <strata/ops/creation.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/stream.h"
#include "ops/cuda/conv_algorithms.h"

namespace strata::cuda_conv {

namespace {

std::mutex g_mutex;
std::atomic<int64_t> g_searches{0}, g_hits{0};

// Never destroyed: convolutions may run from static destructors of user code.
std::map<ConvSignature, std::vector<ConvAlgorithm>>& cache() {
  static auto* m = new std::map<ConvSignature, std::vector<ConvAlgorithm>>();
  return *m;
}

bool usable(cudnnStatus_t status, cudnnDeterminism_t determinism, cudnnMathType_t math, const ConvSignature& sig) {
  if (status != CUDNN_STATUS_SUCCESS) return false;
  if (sig.deterministic && determinism != CUDNN_DETERMINISTIC) return false;
  if (sig.dtype == CUDNN_DATA_FLOAT) {
    if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    if (!sig.tf32 && math == CUDNN_TENSOR_OP_MATH) return false;
  }
  return true;
}

cudnnMathType_t run_math(cudnnMathType_t reported, const ConvSignature& sig) {
  return sig.dtype == CUDNN_DATA_FLOAT && !sig.tf32 ? CUDNN_FMA_MATH : reported;
}

// Checks an algorithm query; false (no candidates) when cuDNN does not support the problem.
bool query(cudnnStatus_t status, const char* call, const char* op) {
  if (cuda::cudnn_not_supported(status)) return false;
  cuda::cudnn_check(status, call, op);
  return true;
}

// The usable entries of a perf array, in its order (best first), without repeats.
template <class Perf>
std::vector<ConvAlgorithm> candidates(const Perf* perf, int count, const ConvSignature& sig) {
  std::vector<ConvAlgorithm> out;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (!usable(p.status, p.determinism, p.mathType, sig)) continue;
    const ConvAlgorithm a{static_cast<int>(p.algo), run_math(p.mathType, sig), p.memory};
    if (std::none_of(out.begin(), out.end(), [&](const ConvAlgorithm& b) { return b.algo == a.algo && b.math == a.math; }))
      out.push_back(a);
  }
  return out;
}

std::vector<ConvAlgorithm> heuristic(const ConvSignature& sig, const ConvCall& c, const char* op) {
  int n = 0;
  switch (sig.kind) {
    case ConvKind::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      const cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(
          c.handle, c.x_desc, c.w_desc, c.conv_desc, c.y_desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf);
      if (!query(st, "cudnnGetConvolutionForwardAlgorithm_v7", op)) return {};
      return candidates(perf, n, sig);
    }
    case ConvKind::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      const cudnnStatus_t st = cudnnGetConvolutionBackwardDataAlgorithm_v7(
          c.handle, c.w_desc, c.y_desc, c.conv_desc, c.x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf);
      if (!query(st, "cudnnGetConvolutionBackwardDataAlgorithm_v7", op)) return {};
      return candidates(perf, n, sig);
    }
    case ConvKind::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      const cudnnStatus_t st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          c.handle, c.x_desc, c.y_desc, c.conv_desc, c.w_desc, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf);
      if (!query(st, "cudnnGetConvolutionBackwardFilterAlgorithm_v7", op)) return {};
      return candidates(perf, n, sig);
    }
  }
  return {};
}

int64_t element_size(cudnnDataType_t t) { return t == CUDNN_DATA_DOUBLE ? 8 : t == CUDNN_DATA_FLOAT ? 4 : 2; }

// The timed ranking, or the heuristic one when timing found nothing usable (every candidate
// needed more workspace than could be had, say).
std::vector<ConvAlgorithm> timed(std::vector<ConvAlgorithm> ranked, const std::vector<ConvAlgorithm>& known) {
  return ranked.empty() ? known : ranked;
}

// Times the algorithms on the call's buffers with the largest workspace any heuristic
// candidate asks for that can be allocated (cudnnFind*Ex only tries what fits in it).
std::vector<ConvAlgorithm> timed_search(const ConvSignature& sig, const ConvCall& c, const char* op) {
  const std::vector<ConvAlgorithm> known = heuristic(sig, c, op);
  if (known.empty()) return known;
  std::vector<size_t> sizes;
  for (const ConvAlgorithm& a : known) sizes.push_back(a.workspace);
  std::sort(sizes.rbegin(), sizes.rend());
  Tensor workspace;
  size_t bytes = 0;
  for (size_t s : sizes) {
    workspace = conv_workspace(sig.device, s);
    if (s == 0 || workspace.defined()) {
      bytes = s;
      break;
    }
  }
  void* ws = bytes ? workspace.data() : nullptr;
  int n = 0;
  switch (sig.kind) {
    case ConvKind::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      const cudnnStatus_t st =
          cudnnFindConvolutionForwardAlgorithmEx(c.handle, c.x_desc, c.x, c.w_desc, c.w, c.conv_desc, c.y_desc, c.y,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, ws, bytes);
      return query(st, "cudnnFindConvolutionForwardAlgorithmEx", op) ? timed(candidates(perf, n, sig), known) : known;
    }
    case ConvKind::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      const cudnnStatus_t st =
          cudnnFindConvolutionBackwardDataAlgorithmEx(c.handle, c.w_desc, c.w, c.y_desc, c.y, c.conv_desc, c.x_desc,
                                                      c.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf, ws, bytes);
      return query(st, "cudnnFindConvolutionBackwardDataAlgorithmEx", op) ? timed(candidates(perf, n, sig), known)
                                                                          : known;
    }
    case ConvKind::BackwardFilter: {
      const int64_t filter = int64_t(sig.o) * (sig.c / sig.groups) * sig.kd * sig.kh * sig.kw;
      Tensor scratch = empty({filter * element_size(sig.dtype)}, TensorOptions(kUInt8, Device::cuda(sig.device)));
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      const cudnnStatus_t st = cudnnFindConvolutionBackwardFilterAlgorithmEx(
          c.handle, c.x_desc, c.x, c.y_desc, c.y, c.conv_desc, c.w_desc, scratch.data(),
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf, ws, bytes);
      return query(st, "cudnnFindConvolutionBackwardFilterAlgorithmEx", op) ? timed(candidates(perf, n, sig), known)
                                                                            : known;
    }
  }
  return {};
}

// The workspace each candidate needs in the math type it runs in, which can exceed what the
// library reported for the type it listed (float32 runs FMA math: Note [Convolution math]);
// cuDNN rejects a call given less. Candidates it does not support so are dropped.
std::vector<ConvAlgorithm> with_workspaces(const ConvSignature& sig, const ConvCall& c, std::vector<ConvAlgorithm> algos,
                                           const char* op) {
  std::vector<ConvAlgorithm> out;
  for (ConvAlgorithm a : algos) {
    cuda::cudnn_check(cudnnSetConvolutionMathType(c.conv_desc, a.math), "cudnnSetConvolutionMathType", op);
    size_t bytes = 0;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (sig.kind) {
      case ConvKind::Forward:
        st = cudnnGetConvolutionForwardWorkspaceSize(c.handle, c.x_desc, c.w_desc, c.conv_desc, c.y_desc,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), &bytes);
        break;
      case ConvKind::BackwardData:
        st = cudnnGetConvolutionBackwardDataWorkspaceSize(c.handle, c.w_desc, c.y_desc, c.conv_desc, c.x_desc,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), &bytes);
        break;
      case ConvKind::BackwardFilter:
        st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
            c.handle, c.x_desc, c.y_desc, c.conv_desc, c.w_desc, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
            &bytes);
        break;
    }
    if (cuda::cudnn_not_supported(st)) continue;
    cuda::cudnn_check(st, "cudnnGetConvolution*WorkspaceSize", op);
    a.workspace = std::max(a.workspace, bytes);
    out.push_back(a);
  }
  return out;
}

}  // namespace

cudnnMathType_t initial_math(cudnnDataType_t dtype, bool tf32) {
  switch (dtype) {
    case CUDNN_DATA_FLOAT: return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return CUDNN_TENSOR_OP_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

Tensor conv_workspace(int device, size_t bytes) {
  if (bytes == 0) return Tensor();
  const int64_t ooms = cuda::memory_stats(device).num_ooms;
  try {
    return empty({static_cast<int64_t>(bytes)}, TensorOptions(kUInt8, Device::cuda(device)));
  } catch (const Error&) {
    // out of memory even after the allocator released its cache: an algorithm with less
    // workspace will do; any other failure (a broken device) is raised
    if (cuda::memory_stats(device).num_ooms == ooms) throw;
    return Tensor();
  }
}

std::vector<ConvAlgorithm> conv_algorithms(const ConvSignature& sig, const ConvCall& call, const char* op) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = cache().find(sig);
    if (it != cache().end()) {
      g_hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  // searched without the lock (a timed search takes a while); two threads that race on one
  // signature both search, and the first result stays
  if (sig.benchmark)
    cuda::check_not_capturing(cuda::current_stream(sig.device), op, "a cuDNN benchmark-mode algorithm search",
                              "it times the algorithms and waits for the device; run the step once before capture "
                              "(a warm-up) so the choice is cached");
  g_searches.fetch_add(1, std::memory_order_relaxed);
  std::vector<ConvAlgorithm> found =
      with_workspaces(sig, call, sig.benchmark ? timed_search(sig, call, op) : heuristic(sig, call, op), op);
  std::lock_guard<std::mutex> lock(g_mutex);
  return cache().emplace(sig, std::move(found)).first->second;
}

}  // namespace strata::cuda_conv

namespace strata::cuda {
ConvAlgorithmCacheStats conv_algorithm_cache_stats() {
  ConvAlgorithmCacheStats s;
  {
    std::lock_guard<std::mutex> lock(cuda_conv::g_mutex);
    s.entries = static_cast<int64_t>(cuda_conv::cache().size());
  }
  s.searches = cuda_conv::g_searches.load(std::memory_order_relaxed);
  s.hits = cuda_conv::g_hits.load(std::memory_order_relaxed);
  return s;
}
}  // namespace strata::cuda
