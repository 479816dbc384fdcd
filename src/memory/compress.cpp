// Activation compression: see include/strata/memory/compress.hpp.
//
// Note [Compression by saved-tensor hooks]
// The guard installs saved-tensor hooks whose pack stores a compressed copy and whose unpack
// decodes it, both composed of tensor ops (so they run where the tensor lives) with grad
// recording and autocast off, since the copies are data, not part of the model's graph. A
// tensor saved twice (tanh's output is also the next matmul's input) is compressed once: the
// guard remembers, by storage, offset, view and version, the packed copy while it lives, or
// two 16-bit copies would cost as much as the float32 original.
#include <strata/memory/compress.hpp>

#include <any>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

namespace strata::memory {

namespace {

constexpr int64_t kMaxBlockSize = 4096;

struct Compressed {
  Tensor data;    // bfloat16/float16 values, or int8 codes (blocks, block_size)
  Tensor scales;  // int8 only: (blocks, 1) float32
  Shape shape;
  DType dtype = kFloat32;
};

// Data ops in pack/unpack: no graph, no autocast casts.
struct PlainOpsScope {
  NoGradGuard no_grad;
  amp::AutocastGuard cpu{DeviceType::CPU, false};
  amp::AutocastGuard cuda{DeviceType::CUDA, false};
};

struct CacheEntry {
  std::weak_ptr<Storage> storage;
  int64_t offset = 0;
  Shape shape;
  Strides strides;
  DType dtype = kFloat32;
  int64_t version = 0;
  std::weak_ptr<const Compressed> packed;
};

bool should_compress(const Tensor& t, const CompressOptions& options) {
  if (!is_floating(t.dtype()) || t.numel() < options.min_numel) return false;
  if (t.requires_grad() && t.is_leaf()) return false;  // parameters and inputs stay alive anyway
  const bool wide = t.dtype() == kFloat32 || t.dtype() == kFloat64;
  return wide || options.mode == CompressionMode::Int8;
}

std::shared_ptr<const Compressed> compress(const Tensor& t, const CompressOptions& options) {
  PlainOpsScope plain;
  auto out = std::make_shared<Compressed>();
  out->shape = t.shape();
  out->dtype = t.dtype();
  switch (options.mode) {
    case CompressionMode::Bfloat16: out->data = t.detach().to(kBFloat16); break;
    case CompressionMode::Float16: out->data = t.detach().to(kFloat16); break;
    case CompressionMode::Int8: {
      Int8Blocks q = quantize_int8(t.detach(), options.block_size);
      out->data = q.codes;
      out->scales = q.scales;
      break;
    }
  }
  return out;
}

Tensor decompress(const Compressed& c) {
  STRATA_CHECK(!autograd::is_grad_enabled(), "[compress_activations] double backward (create_graph=true) through "
               "a compressed saved tensor is not supported");
  PlainOpsScope plain;
  if (c.scales.defined()) return dequantize_int8({c.data, c.scales}, c.shape, c.dtype);
  return c.data.to(c.dtype);
}

}  // namespace

struct CompressActivations::Impl {
  CompressOptions options;
  std::mutex mutex;
  std::vector<CacheEntry> cache;  // saves packed under this guard, while their copies live
  autograd::SavedTensorHooksGuard hooks;

  explicit Impl(const CompressOptions& opts)
      : options(opts),
        hooks([this](const Tensor& t) { return pack(t); },
              [](const std::any& packed) -> Tensor {
                if (const auto* c = std::any_cast<std::shared_ptr<const Compressed>>(&packed)) return decompress(**c);
                return std::any_cast<Tensor>(packed);
              }) {}

  std::any pack(const Tensor& t) {
    if (!should_compress(t, options)) return t;
    std::lock_guard<std::mutex> lock(mutex);
    std::erase_if(cache, [](const CacheEntry& e) { return e.packed.expired() || e.storage.expired(); });
    for (const CacheEntry& e : cache)
      if (e.storage.lock() == t.storage() && e.offset == t.storage_offset() && e.shape == t.shape() &&
          e.strides == t.strides() && e.dtype == t.dtype() && e.version == t.version())
        if (auto hit = e.packed.lock()) return hit;
    std::shared_ptr<const Compressed> packed = compress(t, options);
    cache.push_back({t.storage(), t.storage_offset(), t.shape(), t.strides(), t.dtype(), t.version(), packed});
    return packed;
  }
};

CompressActivations::CompressActivations(const CompressOptions& options) {
  STRATA_CHECK(options.mode == CompressionMode::Bfloat16 || options.mode == CompressionMode::Float16 ||
                   options.mode == CompressionMode::Int8,
               "[compress_activations] unknown mode {}", static_cast<int>(options.mode));
  STRATA_CHECK(options.min_numel >= 0, "[compress_activations] min_numel must be >= 0, got {}", options.min_numel);
  STRATA_CHECK(options.block_size >= 1 && options.block_size <= kMaxBlockSize,
               "[compress_activations] block_size must be in [1, {}], got {}", kMaxBlockSize, options.block_size);
  impl_ = new Impl(options);
}

CompressActivations::~CompressActivations() { delete impl_; }

Int8Blocks quantize_int8(const Tensor& x, int64_t block_size) {
  STRATA_CHECK(block_size >= 1 && block_size <= kMaxBlockSize, "[quantize_int8] block_size must be in [1, {}], got {}",
               kMaxBlockSize, block_size);
  STRATA_CHECK(is_floating(x.dtype()), "[quantize_int8] expects a floating tensor, got {}", x.dtype());
  PlainOpsScope plain;
  const int64_t n = x.numel();
  const int64_t blocks = (n + block_size - 1) / block_size;
  Tensor flat = x.detach().reshape({n}).to(kFloat32);
  if (blocks * block_size != n)
    flat = cat({flat, zeros({blocks * block_size - n}, TensorOptions(kFloat32, x.device()))});
  Tensor grid = flat.reshape({blocks, block_size});
  // an all-zero block gets the smallest normal scale, so the division stays finite
  Tensor scales = clamp(amax(abs(grid), {1}, true) / 127.0, std::numeric_limits<float>::min(), std::nullopt);
  Tensor codes = clamp(round(grid / scales), -127, 127).to(kInt8);
  return {codes, scales};
}

Tensor dequantize_int8(const Int8Blocks& q, const Shape& shape, DType dtype) {
  PlainOpsScope plain;
  const int64_t n = checked_numel(shape, "dequantize_int8");
  Tensor flat = (q.codes.to(kFloat32) * q.scales).reshape({-1});
  STRATA_CHECK(flat.numel() >= n, "[dequantize_int8] {} codes cannot fill shape {}", flat.numel(), shape);
  return flat.narrow(0, 0, n).reshape(shape).to(dtype);
}

}  // namespace strata::memory
