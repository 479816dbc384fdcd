// The oneDNN convolution backend (f32): forward, backward-data and backward-weights
// primitives on the caller's arrays, described to oneDNN by their real strides (NCHW or NHWC)
// and reordered to and from the layouts its kernels want.
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

struct Key {
  Kind kind;
  ConvType type;
  bool bias;
  ConvGeometry g;
  int64_t src[4], weight[4], dst[4];
  bool operator==(const Key& o) const {
    auto same = [](const int64_t* a, const int64_t* b) { return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]; };
    return kind == o.kind && type == o.type && bias == o.bias && g == o.g && same(src, o.src) &&
           same(weight, o.weight) && same(dst, o.dst);
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
    mix(static_cast<int64_t>(k.kind) | (int64_t(k.bias) << 8) | (static_cast<int64_t>(k.type) << 16));
    const ConvGeometry& g = k.g;
    for (int64_t v : {g.n, g.c_in, g.h_in, g.w_in, g.c_out, g.h_out, g.w_out, g.kh, g.kw, g.stride_h, g.stride_w,
                      g.pad_h, g.pad_w, g.dil_h, g.dil_w, g.groups})
      mix(v);
    for (int i = 0; i < 4; ++i) mix(k.src[i]), mix(k.weight[i]), mix(k.dst[i]);
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

memory::desc strided(const memory::dims& dims, const int64_t* s, dt type) {
  return memory::desc(dims, type, memory::dims(s, s + 4));
}

// Weights (c_out, Cg, kh, kw); grouped convolutions take them as (groups, Og, Cg, kh, kw).
memory::desc weight_desc(const ConvGeometry& g, const int64_t* s, dt type) {
  const int64_t cg = g.c_in / g.groups, og = g.c_out / g.groups;
  if (g.groups == 1) return strided({g.c_out, cg, g.kh, g.kw}, s, type);
  return memory::desc({g.groups, og, cg, g.kh, g.kw}, type, {og * s[0], s[0], s[1], s[2], s[3]});
}


// oneDNN's right padding makes its output size formula exact; it may be negative when the
// last window stops short of the padded input, as with PyTorch's floor rounding.
memory::dims right_padding(const ConvGeometry& g) {
  return {(g.h_out - 1) * g.stride_h + (g.kh - 1) * g.dil_h + 1 - g.h_in - g.pad_h,
          (g.w_out - 1) * g.stride_w + (g.kw - 1) * g.dil_w + 1 - g.w_in - g.pad_w};
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
bool fast(const PD& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;  // the reference kernel is slower than ours
}

std::shared_ptr<const Entry> build(const Key& key) {
  auto entry = std::make_shared<Entry>();
  const ConvGeometry& g = key.g;
  const memory::dims strides{g.stride_h, g.stride_w}, dil{g.dil_h - 1, g.dil_w - 1}, pad_l{g.pad_h, g.pad_w};
  const memory::dims pad_r = right_padding(g);
  const Types t = types_of(key.type);
  const bool int8 = key.type == ConvType::U8S8;
  if (int8 && (key.kind != Kind::Forward || key.bias || !exact_int8())) return entry;
  const memory::desc src = strided({g.n, g.c_in, g.h_in, g.w_in}, key.src, t.src);
  const memory::desc dst = strided({g.n, g.c_out, g.h_out, g.w_out}, key.dst, t.dst);
  const memory::desc wei = weight_desc(g, key.weight, t.weight);
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

bool run(Kind kind, const ConvProblem& p) {
  if (p.type == ConvType::F64) return false;
  const ConvGeometry& g = p.g;
  if (g.n == 0 || g.c_in == 0 || g.c_out == 0 || g.h_out <= 0 || g.w_out <= 0) return false;
  Key key{kind, p.type, p.bias != nullptr, g, {}, {}, {}};
  for (int i = 0; i < 4; ++i) key.src[i] = p.src.stride[i], key.weight[i] = p.weight.stride[i], key.dst[i] = p.dst.stride[i];
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
    void* data[3] = {p.src.data, p.weight.data, p.dst.data};
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
    throw std::runtime_error(std::string("[conv2d] oneDNN failed: ") + e.what());
  }
  return true;
}

}  // namespace

bool conv_forward_dnnl(const ConvProblem& p) { return run(Kind::Forward, p); }
bool conv_backward_data_dnnl(const ConvProblem& p) { return run(Kind::BackwardData, p); }
bool conv_backward_weights_dnnl(const ConvProblem& p) { return run(Kind::BackwardWeights, p); }

int64_t conv_dnnl_cache_size() { return static_cast<int64_t>(cache().size()); }

}  // namespace strata::cpu
