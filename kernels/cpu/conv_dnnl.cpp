// The oneDNN convolution backend (f32): forward, backward-data and backward-weights
// primitives on the caller's arrays, described to oneDNN by their real strides (NCHW or NHWC,
// and NCDHW for the 3-d ones) and reordered to and from the layouts its kernels want. 2-d and
// 3-d problems take one path, as rank 2 or 3 of one description (Nd).
//
// Note [Convolution primitive formats]
// Every operand is declared to oneDNN as `any`, so it picks the layout its fastest kernel
// wants: for f32 that is a blocked one (nChw16c activations, OIhw16i16o weights) and its
// direct `jit:avx512_core` convolutions, where the caller's plain NCHW would get the slower
// im2col + GEMM kernel (`gemm:jit`): about 4x slower for backward-weights at 64 channels,
// 32x32. Channels-last callers often get nhwc itself and no reorder. When the primitive's
// format for an operand differs from the caller's, the operand is reordered into (or out
// of) a per-thread buffer around the call, as LibTorch does for plain tensors. Primitives and
// their reorders are built once per problem signature and kept in a bounded LRU cache shared
// by all threads (see Note [oneDNN primitive cache] in gemm_dnnl.cpp); a signature for which
// oneDNN offers only its reference kernel is cached as unsupported, and the caller falls back
// to conv_ref.cpp.
//
// U8S8 (the int8 layers of src/quant): uint8 src with a zero point, a runtime attribute of
// the primitive so that one primitive serves every zero point, int8 weights and int32 sums;
// oneDNN treats the padding as holding the zero point. Only on CPUs with VNNI (vpdpbusd): on
// others oneDNN's int8 kernels multiply in int16 pairs (vpmaddubsw), which saturate, and the
// sums must be exact.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>

#include "conv.h"
#include "dnnl_cache.h"

namespace strata::cpu {

namespace {

using dnnl::memory;

constexpr size_t kCacheCapacity = 128;

enum class Kind : uint8_t { Forward, BackwardData, BackwardWeights };

// A problem of either rank (2-d or 3-d) in one form: with its kind and types, the cache's key.
struct Nd {
  int64_t rank = 2;  // spatial dims; the arrays below hold rank (spatial) or rank + 2 (strides) values
  int64_t n = 0, c_in = 0, c_out = 0, groups = 1;
  int64_t in[3] = {}, out[3] = {}, k[3] = {}, stride[3] = {}, pad[3] = {}, dil[3] = {};
  int64_t src[5] = {}, weight[5] = {}, dst[5] = {};  // element strides
  bool operator==(const Nd&) const = default;
};

struct Key {
  Kind kind;
  ConvType type;
  bool bias;
  Nd nd;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
    mix(static_cast<int64_t>(k.kind) | (int64_t(k.bias) << 8) | (static_cast<int64_t>(k.type) << 16));
    const Nd& d = k.nd;
    for (int64_t v : {d.rank, d.n, d.c_in, d.c_out, d.groups}) mix(v);
    for (const int64_t* a : {d.in, d.out, d.k, d.stride, d.pad, d.dil})
      for (int i = 0; i < 3; ++i) mix(a[i]);
    for (const int64_t* a : {d.src, d.weight, d.dst})
      for (int i = 0; i < 5; ++i) mix(a[i]);
    return static_cast<size_t>(h);
  }
};

// One array argument of the primitive: the caller's descriptor, the primitive's, and the
// reorder between them when they differ.
struct Operand {
  int arg = 0;  // DNNL_ARG_*
  memory::desc user, prim;
  bool is_output = false;
  bool reordered = false;
  dnnl::reorder reorder;  // user -> prim for inputs, prim -> user for outputs
};

struct Entry {
  bool usable = false;
  dnnl::primitive primitive;
  Operand src, weight, dst;  // in the roles of the forward problem
  bool bias = false;
  size_t scratchpad_bytes = 0;
};

using Cache = dnnl_support::PrimitiveCache<Key, Entry, KeyHash, kCacheCapacity>;

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: may be used at exit
  return *c;
}

using dnnl_support::engine;
using dnnl_support::exact_int8;

using dt = memory::data_type;

// The data types of src, weight and dst.
struct Types {
  dt src, weight, dst;
};
Types types_of(ConvType t) {
  if (t == ConvType::U8S8) return {dt::u8, dt::s8, dt::s32};
  return {dt::f32, dt::f32, dt::f32};
}

// (n, c, spatial...) with the caller's strides.
memory::desc activation_desc(const Nd& g, int64_t c, const int64_t* spatial, const int64_t* s, dt type) {
  memory::dims dims{g.n, c};
  dims.insert(dims.end(), spatial, spatial + g.rank);
  return memory::desc(dims, type, memory::dims(s, s + g.rank + 2));
}

// Weights (c_out, Cg, k...); grouped convolutions take them as (groups, Og, Cg, k...).
memory::desc weight_desc(const Nd& g, dt type) {
  const int64_t cg = g.c_in / g.groups, og = g.c_out / g.groups;
  const int64_t* s = g.weight;
  memory::dims dims{g.c_out, cg}, strides(s, s + g.rank + 2);
  dims.insert(dims.end(), g.k, g.k + g.rank);
  if (g.groups > 1) {
    dims[0] = og;
    dims.insert(dims.begin(), g.groups);
    strides.insert(strides.begin(), og * s[0]);
  }
  return memory::desc(dims, type, strides);
}

// oneDNN's right padding makes its output size formula exact; it may be negative when the
// last window stops short of the padded input, as with PyTorch's floor rounding.
memory::dims right_padding(const Nd& g) {
  memory::dims r;
  for (int64_t i = 0; i < g.rank; ++i)
    r.push_back((g.out[i] - 1) * g.stride[i] + (g.k[i] - 1) * g.dil[i] + 1 - g.in[i] - g.pad[i]);
  return r;
}

void bind(Operand& op, int arg, const memory::desc& user, const memory::desc& prim, bool is_output) {
  op.arg = arg;
  op.user = user;
  op.prim = prim;
  op.is_output = is_output;
  op.reordered = user != prim;
  if (op.reordered) {
    auto& e = engine();
    op.reorder = is_output ? dnnl::reorder(dnnl::reorder::primitive_desc(e, prim, e, user))
                           : dnnl::reorder(dnnl::reorder::primitive_desc(e, user, e, prim));
  }
}

template <class PD>
bool is_fast(const PD& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;  // the reference kernel is slower than ours
}

std::shared_ptr<const Entry> build(const Key& key) {
  auto entry = std::make_shared<Entry>();
  const Nd& g = key.nd;
  const memory::dims strides(g.stride, g.stride + g.rank), pad_l(g.pad, g.pad + g.rank);
  memory::dims dil;
  for (int64_t i = 0; i < g.rank; ++i) dil.push_back(g.dil[i] - 1);
  const memory::dims pad_r = right_padding(g);
  const Types t = types_of(key.type);
  const bool int8 = key.type == ConvType::U8S8;
  if (int8 && (key.kind != Kind::Forward || key.bias || !exact_int8())) return entry;
  const memory::desc src = activation_desc(g, g.c_in, g.in, g.src, t.src);
  const memory::desc dst = activation_desc(g, g.c_out, g.out, g.dst, t.dst);
  const memory::desc wei = weight_desc(g, t.weight);
  // 2-d problems fall back to conv_ref.cpp; 3-d ones have no reference here and take what oneDNN
  // picks (its gemm-based 3-d kernel covers every float32 geometry, so its slow reference one is
  // not expected)
  auto fast = [&](const auto& pd) { return g.rank == 3 || is_fast(pd); };
  const memory::desc sany(src.dims(), t.src, memory::format_tag::any);
  const memory::desc dany(dst.dims(), t.dst, memory::format_tag::any);
  const memory::desc wany(wei.dims(), t.weight, memory::format_tag::any);
  const memory::desc bias = key.bias ? memory::desc({g.c_out}, dt::f32, memory::format_tag::x) : memory::desc();
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    if (int8) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    auto& eng = engine();
    const auto prop = int8 ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training;
    dnnl::convolution_forward::desc fd(prop, algo, sany, wany, bias, dany, strides, dil, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc fpd(fd, attr, eng);
    entry->bias = key.bias;
    if (key.kind == Kind::Forward) {
      if (!fast(fpd)) return entry;
      bind(entry->src, DNNL_ARG_SRC, src, fpd.src_desc(), false);
      bind(entry->weight, DNNL_ARG_WEIGHTS, wei, fpd.weights_desc(), false);
      bind(entry->dst, DNNL_ARG_DST, dst, fpd.dst_desc(), true);
      entry->primitive = dnnl::convolution_forward(fpd);
      entry->scratchpad_bytes = fpd.scratchpad_desc().get_size();
    } else if (key.kind == Kind::BackwardData) {
      dnnl::convolution_backward_data::desc bd(algo, sany, wany, dany, strides, dil, pad_l, pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(bd, attr, eng, fpd);
      if (!fast(pd)) return entry;
      bind(entry->src, DNNL_ARG_DIFF_SRC, src, pd.diff_src_desc(), true);
      bind(entry->weight, DNNL_ARG_WEIGHTS, wei, pd.weights_desc(), false);
      bind(entry->dst, DNNL_ARG_DIFF_DST, dst, pd.diff_dst_desc(), false);
      entry->primitive = dnnl::convolution_backward_data(pd);
      entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
    } else {
      dnnl::convolution_backward_weights::desc wd(algo, sany, wany, bias, dany, strides, dil, pad_l, pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(wd, attr, eng, fpd);
      if (!fast(pd)) return entry;
      bind(entry->src, DNNL_ARG_SRC, src, pd.src_desc(), false);
      bind(entry->weight, DNNL_ARG_DIFF_WEIGHTS, wei, pd.diff_weights_desc(), true);
      bind(entry->dst, DNNL_ARG_DIFF_DST, dst, pd.diff_dst_desc(), false);
      entry->primitive = dnnl::convolution_backward_weights(pd);
      entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
    }
    entry->usable = true;
  } catch (const dnnl::error&) {
    entry->usable = false;  // unsupported geometry or layout on this CPU
  }
  return entry;
}

// A per-thread, 64-byte aligned buffer that only grows.
class Buffer {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      data_.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      if (!data_) throw std::bad_alloc();
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t size_ = 0;
};

// One call: the problem, its arrays and the src zero point (U8S8).
struct Call {
  ConvType type;
  Nd nd;
  void *src, *weight, *dst, *bias;
  int32_t src_zero_point;
};

Nd nd_of(const ConvProblem& p) {
  const ConvGeometry& g = p.g;
  Nd d{2, g.n, g.c_in, g.c_out, g.groups, {g.h_in, g.w_in}, {g.h_out, g.w_out}, {g.kh, g.kw},
       {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w}, {g.dil_h, g.dil_w}};
  std::copy(p.src.stride, p.src.stride + 4, d.src);
  std::copy(p.weight.stride, p.weight.stride + 4, d.weight);
  std::copy(p.dst.stride, p.dst.stride + 4, d.dst);
  return d;
}

Nd nd_of(const Conv3dProblem& p) {
  const Conv3dGeometry& g = p.g;
  Nd d{3, g.n, g.c_in, g.c_out, g.groups};
  for (int i = 0; i < 3; ++i)
    d.in[i] = g.in[i], d.out[i] = g.out[i], d.k[i] = g.k[i], d.stride[i] = g.stride[i], d.pad[i] = g.pad[i],
    d.dil[i] = g.dil[i];
  std::copy(p.src.stride, p.src.stride + 5, d.src);
  std::copy(p.weight.stride, p.weight.stride + 5, d.weight);
  std::copy(p.dst.stride, p.dst.stride + 5, d.dst);
  return d;
}

bool run(Kind kind, const Call& p) {
  if (p.type == ConvType::F64) return false;
  const Nd& g = p.nd;
  if (g.n == 0 || g.c_in == 0 || g.c_out == 0) return false;
  for (int64_t i = 0; i < g.rank; ++i)
    if (g.out[i] <= 0) return false;
  const Key key{kind, p.type, p.bias != nullptr, g};
  std::shared_ptr<const Entry> entry = cache().find(key);
  if (!entry) {
    entry = build(key);
    cache().insert(key, entry);
  }
  if (!entry->usable) return false;

  thread_local dnnl::stream stream(engine());
  thread_local Buffer buffers[4];  // src, weight, dst, scratchpad
  dnnl::engine& eng = engine();
  try {
    std::unordered_map<int, dnnl::memory> args;
    std::vector<std::pair<const Operand*, std::pair<memory, memory>>> after;  // output reorders
    const Operand* ops[3] = {&entry->src, &entry->weight, &entry->dst};
    void* data[3] = {p.src, p.weight, p.dst};
    for (int i = 0; i < 3; ++i) {
      const Operand& op = *ops[i];
      memory user(op.user, eng, data[i]);
      if (!op.reordered) {
        args.emplace(op.arg, user);
        continue;
      }
      memory prim(op.prim, eng, buffers[i].get(op.prim.get_size()));
      if (!op.is_output) op.reorder.execute(stream, user, prim);
      else after.push_back({&op, {prim, user}});
      args.emplace(op.arg, prim);
    }
    if (entry->bias) {
      memory::desc bd({g.c_out}, memory::data_type::f32, memory::format_tag::x);
      args.emplace(kind == Kind::BackwardWeights ? DNNL_ARG_DIFF_BIAS : DNNL_ARG_BIAS, memory(bd, eng, p.bias));
    }
    int32_t zero_point = p.src_zero_point;
    if (p.type == ConvType::U8S8) {
      memory::desc zd({1}, dt::s32, memory::format_tag::x);
      args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, memory(zd, eng, &zero_point));
    }
    if (entry->scratchpad_bytes > 0) {
      memory::desc sd({static_cast<int64_t>(entry->scratchpad_bytes)}, memory::data_type::u8, memory::format_tag::a);
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(sd, eng, buffers[3].get(entry->scratchpad_bytes)));
    }
    entry->primitive.execute(stream, args);
    for (auto& [op, mems] : after) op->reorder.execute(stream, mems.first, mems.second);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string(g.rank == 3 ? "[conv3d]" : "[conv2d]") + " oneDNN failed: " + e.what());
  }
  return true;
}

Call call_of(const ConvProblem& p) {
  return {p.type, nd_of(p), p.src.data, p.weight.data, p.dst.data, p.bias, p.src_zero_point};
}
Call call_of(const Conv3dProblem& p) {
  return {ConvType::F32, nd_of(p), p.src.data, p.weight.data, p.dst.data, p.bias, 0};
}

}  // namespace

bool conv_forward_dnnl(const ConvProblem& p) { return run(Kind::Forward, call_of(p)); }
bool conv_backward_data_dnnl(const ConvProblem& p) { return run(Kind::BackwardData, call_of(p)); }
bool conv_backward_weights_dnnl(const ConvProblem& p) { return run(Kind::BackwardWeights, call_of(p)); }
bool conv3d_forward_dnnl(const Conv3dProblem& p) { return run(Kind::Forward, call_of(p)); }
bool conv3d_backward_data_dnnl(const Conv3dProblem& p) { return run(Kind::BackwardData, call_of(p)); }
bool conv3d_backward_weights_dnnl(const Conv3dProblem& p) { return run(Kind::BackwardWeights, call_of(p)); }
bool conv_dnnl_available() { return true; }

int64_t conv_dnnl_cache_size() { return static_cast<int64_t>(cache().size()); }

}  // namespace strata::cpu
