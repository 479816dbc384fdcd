// CPU loops for sort and topk along one dim. The order puts NaN above every number (so NaNs
// come last ascending and first descending, as in PyTorch), -0.0 level with +0.0, and breaks
// ties by position, which makes sort stable and topk deterministic on ties.
//
// Note [Sort keys]: each element of a slice becomes its order key (kernels/common/sort_key.h,
// shared with the CUDA sort; inverted for descending) beside its position, so the slice
// orders by integer comparisons: keys of up to 32 bits and their position share one 64-bit
// word (no two words are equal), which a full sort orders by an LSD radix sort on the key's
// bytes (stable, so ties keep position order) and topk by a partial sort (a heap of the best
// k, which most words pass by after one comparison) when k is small, else by nth_element and
// a sort of the first k. 64-bit keys are (key, position) pairs. The values written are read
// back from the slice at each position, bit for bit (NaN payloads and the sign of zero included).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../common/sort_key.h"
#include "parallel.h"
#include "strided_rows.h"

namespace strata::cpu {

/// One slice per outer position: operands (x, values, indices) of `outer`; along the dim the
/// slice has `n` elements at strides x_stride, v_stride, i_stride.
struct SliceDim {
  int64_t n;
  int64_t x_stride, v_stride, i_stride;
};

namespace detail {

// Slices at least this long take the radix sort; std::sort is faster below.
inline constexpr int64_t kRadixMinLength = 512;
// topk up to this k keeps a heap of the best k; larger k partitions the slice first.
inline constexpr int64_t kHeapMaxK = 64;

// Puts the first k of [first, last) in order at its front.
template <class It>
void order_front(It first, It last, int64_t k) {
  const int64_t n = last - first;
  if (k >= n) {
    std::sort(first, last);
  } else if (k <= kHeapMaxK) {
    std::partial_sort(first, first + k, last);
  } else if (k > 0) {
    std::nth_element(first, first + (k - 1), last);
    std::sort(first, first + (k - 1));
  }
}

// Stable LSD radix sort of `a` by bytes [first_byte, first_byte + bytes) of each word, one
// counting pass per byte; a byte on which every word agrees is skipped.
inline void radix_sort(std::vector<uint64_t>& a, std::vector<uint64_t>& tmp, int first_byte, int bytes) {
  tmp.resize(a.size());
  for (int byte = first_byte; byte < first_byte + bytes; ++byte) {
    const int shift = 8 * byte;
    std::array<size_t, 256> count{};
    for (uint64_t w : a) ++count[(w >> shift) & 0xffu];
    if (count[(a[0] >> shift) & 0xffu] == a.size()) continue;
    size_t sum = 0;
    for (size_t& c : count) {
      const size_t here = c;
      c = sum;
      sum += here;
    }
    for (uint64_t w : a) tmp[count[(w >> shift) & 0xffu]++] = w;
    a.swap(tmp);
  }
}

// The slice's (key, position) words in order, first k of them at least (k = n: all).
template <class T>
void order_packed(const T* xs, int64_t n, int64_t stride, int64_t k, bool descending, std::vector<uint64_t>& words,
                  std::vector<uint64_t>& tmp) {
  using K = sort_key::key_t<T>;
  words.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    K key = sort_key::order_key(xs[j * stride]);
    if (descending) key = static_cast<K>(~key);
    words[static_cast<size_t>(j)] = (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(j);
  }
  if (k == n && n >= kRadixMinLength) radix_sort(words, tmp, 4, static_cast<int>(sizeof(K)));
  else order_front(words.begin(), words.end(), k);
}

struct KeyPos {
  uint64_t key;
  int64_t pos;
  bool operator<(const KeyPos& o) const { return key < o.key || (key == o.key && pos < o.pos); }
};

template <class T>
void order_pairs(const T* xs, int64_t n, int64_t stride, int64_t k, bool descending, std::vector<KeyPos>& pairs) {
  pairs.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    uint64_t key = sort_key::order_key(xs[j * stride]);
    pairs[static_cast<size_t>(j)] = {descending ? ~key : key, j};
  }
  order_front(pairs.begin(), pairs.end(), k);
}

}  // namespace detail

/// Orders each slice of x and writes its first `k` entries (k = n for a full sort).
/// descending = true puts the largest first.
template <class T>
void sort_slices(const StridedLoop<3>& outer, const SliceDim& d, int64_t k, bool descending, const T* x, T* values,
                 int64_t* indices) {
  // positions share a word with keys of up to 32 bits while they fit in 32 bits themselves
  const bool packed = sizeof(sort_key::key_t<T>) <= 4 && d.n <= (int64_t(1) << 32);
  // slices are independent; one thread orders whole slices
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(d.n, 1));
  parallel_for(0, outer.numel, grain, [&](int64_t b, int64_t e) {
    std::vector<uint64_t> words, tmp;
    std::vector<detail::KeyPos> pairs;
    for_each_row(outer, b, e, [&](const auto& off, int64_t rows, const auto& step) {
      for (int64_t r = 0; r < rows; ++r) {
        const T* xs = x + off[0] + r * step[0];
        T* vs = values + off[1] + r * step[1];
        int64_t* is = indices + off[2] + r * step[2];
        auto put = [&](int64_t j, int64_t pos) {
          vs[j * d.v_stride] = xs[pos * d.x_stride];
          is[j * d.i_stride] = pos;
        };
        if (packed) {
          detail::order_packed(xs, d.n, d.x_stride, k, descending, words, tmp);
          for (int64_t j = 0; j < k; ++j) put(j, static_cast<int64_t>(words[static_cast<size_t>(j)] & 0xffffffffu));
        } else {
          detail::order_pairs(xs, d.n, d.x_stride, k, descending, pairs);
          for (int64_t j = 0; j < k; ++j) put(j, pairs[static_cast<size_t>(j)].pos);
        }
      }
    });
  });
}

}  // namespace strata::cpu
