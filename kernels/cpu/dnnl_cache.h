// What the oneDNN GEMM and convolution backends share: the process's one CPU engine, and the
// bounded LRU map of built primitives (Note [oneDNN primitive cache] in gemm_dnnl.cpp).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <dnnl.hpp>

namespace strata::cpu::dnnl_support {

/// The CPU engine every primitive is built for and run on; never destroyed, as primitives may
/// run at exit.
inline dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

/// Whether oneDNN's int8 kernels multiply with VNNI (vpdpbusd), whose uint8 x int8 sums are
/// exact; without it they add products in int16 pairs (vpmaddubsw), which saturate.
inline bool exact_int8() {
  using isa = dnnl::cpu_isa;
  static const bool exact = [] {
    const isa i = dnnl::get_effective_cpu_isa();
    return i == isa::avx512_core_vnni || i == isa::avx512_core_bf16 || i == isa::avx512_core_amx ||
           i == isa::avx2_vnni;
  }();
  return exact;
}

/// At most kCapacity entries by key, the least recently found dropped first; shared by all
/// threads. Entries are immutable once inserted, so a found one may be used after eviction.
template <class Key, class Entry, class Hash, size_t kCapacity>
class PrimitiveCache {
 public:
  std::shared_ptr<const Entry> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);  // most recently used first
    return it->second->second;
  }

  void insert(const Key& key, std::shared_ptr<const Entry> entry) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.count(key)) return;  // another thread built it meanwhile
    order_.emplace_front(key, std::move(entry));
    index_.emplace(key, order_.begin());
    while (order_.size() > kCapacity) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_.size();
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<Key, std::shared_ptr<const Entry>>> order_;
  std::unordered_map<Key, typename decltype(order_)::iterator, Hash> index_;
};

}  // namespace strata::cpu::dnnl_support
