// The oneDNN GEMM backend. A single f32 product goes to oneDNN's BLAS-style sgemm (its jit
// GEMM): on AVX-512 it holds 75-81% of the FMA peak on every large shape, where the matmul
// primitive's brgemm kernel falls to 35% when B is not transposed (2048x768 by 768x3072)
// and to 64% at 4096^3. Batched products and bf16 go through the matmul primitive, which
// reads transposed operands and batch strides directly.
//
// Note [oneDNN primitive cache]
// Creating a matmul primitive costs hundreds of microseconds (it generates code), so each
// one is built once per problem signature (dtype, sizes, leading dims, orientations, batch
// strides, alpha, beta) and kept in a bounded LRU map shared by all threads. A signature
// for which oneDNN has only its slow reference kernel is cached as "unsupported", and the
// caller falls back to Eigen. Primitives use a caller-provided scratchpad (one buffer per
// thread), so the same primitive may run on several threads at once.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>

#include "dnnl_cache.h"
#include "gemm.h"

namespace strata::cpu {

namespace {

constexpr size_t kCacheCapacity = 256;

struct Key {
  GemmType type;
  bool trans_a, trans_b;
  int64_t batch, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  uint64_t alpha_bits, beta_bits;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(key.type) | (uint64_t(key.trans_a) << 8) | (uint64_t(key.trans_b) << 9));
    for (int64_t v : {key.batch, key.m, key.n, key.k, key.lda, key.ldb, key.ldc, key.stride_a, key.stride_b, key.stride_c})
      mix(static_cast<uint64_t>(v));
    mix(key.alpha_bits);
    mix(key.beta_bits);
    return static_cast<size_t>(h);
  }
};

struct Entry {
  bool usable = false;
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c;
  size_t scratchpad_bytes = 0;
};

using Cache = dnnl_support::PrimitiveCache<Key, Entry, KeyHash, kCacheCapacity>;

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: may be used at exit
  return *c;
}

using dnnl_support::engine;

uint64_t bits(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

Key make_key(const GemmProblem& p) {
  const bool batched = p.batch > 1;  // batch strides of a single matrix do not matter
  return Key{p.type, p.a.trans, p.b.trans, p.batch, p.m, p.n, p.k, p.a.ld, p.b.ld, p.c.ld,
             batched ? p.a.batch_stride : 0, batched ? p.b.batch_stride : 0, batched ? p.c.batch_stride : 0,
             bits(p.alpha), bits(p.beta)};
}

// A (batch, rows, cols) descriptor; a batch stride of 0 becomes a broadcast batch dim of 1.
dnnl::memory::desc describe(dnnl::memory::data_type dt, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                            bool trans, int64_t batch_stride) {
  const int64_t rs = trans ? 1 : ld, cs = trans ? ld : 1;
  if (batch == 1) return dnnl::memory::desc({rows, cols}, dt, {rs, cs});
  const int64_t b = batch_stride == 0 ? 1 : batch;
  const int64_t bs = batch_stride == 0 ? rows * cols : batch_stride;
  return dnnl::memory::desc({b, rows, cols}, dt, {bs, rs, cs});
}

std::shared_ptr<const Entry> build(const GemmProblem& p) {
  auto entry = std::make_shared<Entry>();
  const auto dt = p.type == GemmType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  try {
    entry->a = describe(dt, p.batch, p.m, p.k, p.a.ld, p.a.trans, p.a.batch_stride);
    entry->b = describe(dt, p.batch, p.k, p.n, p.b.ld, p.b.trans, p.b.batch_stride);
    entry->c = describe(dt, p.batch, p.m, p.n, p.c.ld, false, p.c.batch_stride);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (p.alpha != 1) attr.set_output_scales(0, {static_cast<float>(p.alpha)});
    if (p.beta != 0) {
      dnnl::post_ops ops;
      ops.append_sum(static_cast<float>(p.beta));
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(entry->a, entry->b, entry->c), attr, engine());
    // the reference kernel is far slower than Eigen: treat it as "no fast kernel"
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return entry;
    entry->primitive = dnnl::matmul(pd);
    entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
    entry->usable = true;
  } catch (const dnnl::error&) {
    entry->usable = false;  // unsupported layout or dtype on this CPU
  }
  return entry;
}

// One f32 product through dnnl_sgemm (row-major, like cblas_sgemm); false when it refuses
// the leading dims, which the matmul primitive may still take.
bool sgemm(const GemmProblem& p) {
  const dnnl_status_t status =
      dnnl_sgemm(p.a.trans ? 'T' : 'N', p.b.trans ? 'T' : 'N', p.m, p.n, p.k, static_cast<float>(p.alpha),
                 static_cast<const float*>(p.a.data), p.a.ld, static_cast<const float*>(p.b.data), p.b.ld,
                 static_cast<float>(p.beta), static_cast<float*>(p.c.data), p.c.ld);
  if (status == dnnl_invalid_arguments) return false;
  if (status != dnnl_success) throw std::runtime_error("[matmul] oneDNN sgemm failed with status " + std::to_string(status));
  return true;
}

}  // namespace

bool gemm_dnnl(const GemmProblem& p) {
  if (p.type != GemmType::F32 && p.type != GemmType::BF16) return false;
  if (p.type == GemmType::F32 && p.batch == 1 && sgemm(p)) return true;
  const Key key = make_key(p);
  std::shared_ptr<const Entry> entry = cache().find(key);
  if (!entry) {
    entry = build(p);
    cache().insert(key, entry);
  }
  if (!entry->usable) return false;

  thread_local dnnl::stream stream(engine());
  thread_local std::vector<unsigned char> scratchpad;
  if (scratchpad.size() < entry->scratchpad_bytes) scratchpad.resize(entry->scratchpad_bytes);
  dnnl::engine& eng = engine();
  try {
    dnnl::memory a(entry->a, eng, const_cast<void*>(p.a.data));
    dnnl::memory b(entry->b, eng, const_cast<void*>(p.b.data));
    dnnl::memory c(entry->c, eng, p.c.data);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (entry->scratchpad_bytes > 0) {
      dnnl::memory::desc sd({static_cast<int64_t>(entry->scratchpad_bytes)}, dnnl::memory::data_type::u8,
                            dnnl::memory::format_tag::a);
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(sd, eng, scratchpad.data()));
    }
    entry->primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("[matmul] oneDNN failed: ") + e.what());
  }
  return true;
}

int64_t gemm_dnnl_cache_size() { return static_cast<int64_t>(cache().size()); }

bool gemm_u8s8s32_dnnl(const uint8_t* a, const int8_t* b, int32_t* c, int64_t m, int64_t n, int64_t k) {
  if (!dnnl_support::exact_int8() || m == 0 || n == 0 || k == 0) return false;
  const int32_t no_offset = 0;  // alpha 1, beta 0, zero offsets: c holds the plain sums
  const dnnl_status_t status =
      dnnl_gemm_u8s8s32('N', 'T', 'F', m, n, k, 1.0f, a, k, 0, b, k, 0, 0.0f, c, n, &no_offset);
  if (status != dnnl_success)
    throw std::runtime_error("[int8 gemm] oneDNN failed with status " + std::to_string(status));
  return true;
}

}  // namespace strata::cpu
