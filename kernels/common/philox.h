// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so element i of a random tensor depends only on (seed, offset, i)
// and the CPU and CUDA kernels produce the same stream for the same seed.
//
// Note [Random stream layout]: element i of a draw uses counter (offset + i / 4) and takes
// lane i % 4 of the four 32-bit outputs. A draw of n elements advances the generator's
// offset by ceil(n / 4). Normals use Box-Muller on lanes (0,1) and (2,3) of one block.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "vec_exp.h"
#include "vec_trig.h"

namespace strata::philox {

struct Block {
  uint32_t v[4];
};

STRATA_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// The Philox4x32 bijection with 10 rounds on a 128-bit counter and 64-bit key.
STRATA_HOST_DEVICE Block philox4x32_10(Block ctr, uint32_t k0, uint32_t k1) {
  uint32_t c0 = ctr.v[0], c1 = ctr.v[1], c2 = ctr.v[2], c3 = ctr.v[3];
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// strata's use: block index in the low 64 counter bits, the seed as the key.
STRATA_HOST_DEVICE Block philox4x32_10(uint64_t counter, uint64_t seed) {
  Block ctr{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in [0, 1) with 24 random bits.
STRATA_HOST_DEVICE float to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * 5.9604644775390625e-8f; }

// Dropout's factor from a lane's bits: scale (1 / (1 - rate)) when the lane's uniform is at
// least rate, else 0; a product rather than a branch, so loops over lanes vectorize.
template <class C>
STRATA_HOST_DEVICE C dropout_factor(uint32_t bits, float rate, C scale) {
  return scale * static_cast<C>(to_unit_float(bits) >= rate);
}

// Lane i (0 to 3) of a block, by selects: a run-time index b.v[i] puts the block in CUDA's
// local memory.
STRATA_HOST_DEVICE uint32_t lane(const Block& b, unsigned i) {
  const uint32_t even = (i & 2) ? b.v[2] : b.v[0], odd = (i & 2) ? b.v[3] : b.v[1];
  return (i & 1) ? odd : even;
}

// Uniform in [0, 1) with 53 random bits, from two lanes.
STRATA_HOST_DEVICE double to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * 1.1102230246251565e-16;
}

// The uniform value of element i of a draw that starts at `offset`.
STRATA_HOST_DEVICE float uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  return to_unit_float(lane(philox4x32_10(offset + i / 4, seed), static_cast<unsigned>(i % 4)));
}

// Box-Muller on a lane pair (a, b): z0 = r cos(theta) and z1 = r sin(theta) with
// r = sqrt(-2 log(1 - u(a))) and theta = 2 pi u(b), through the branch-free float log and
// sine and cosine of vec_exp.h and vec_trig.h on both devices, so that a loop of pairs
// vectorizes on the CPU and the two devices evaluate the same formulas.
STRATA_HOST_DEVICE void box_muller(uint32_t a, uint32_t b, float& z0, float& z1) {
  const float u1 = 1.0f - to_unit_float(a);  // in (0, 1]: never log(0)
  const float radius = sqrtf(-2.0f * math::vec_log(u1));
  float sine, cosine;
  math::vec_sincos_turns(to_unit_float(b), sine, cosine);
  z0 = radius * cosine;
  z1 = radius * sine;
}

// A standard normal value of element i: the even element of its lane pair takes z0, the odd z1.
STRATA_HOST_DEVICE float normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  Block b = philox4x32_10(offset + i / 4, seed);
  unsigned pair = static_cast<unsigned>(i % 4) & ~1u;
  float z0, z1;
  // selects, not b.v[pair] (lane)
  box_muller(pair ? b.v[2] : b.v[0], pair ? b.v[3] : b.v[1], z0, z1);
  return (i & 1u) ? z1 : z0;
}

// The 64-bit value of a lane pair (lanes pair and pair + 1 of b).
STRATA_HOST_DEVICE uint64_t bits64_of(const Block& b, unsigned pair) {
  return (static_cast<uint64_t>(pair ? b.v[2] : b.v[0]) << 32) | (pair ? b.v[3] : b.v[1]);
}

// A uniform 64-bit value of element i, for integer draws.
STRATA_HOST_DEVICE uint64_t bits64_at(uint64_t seed, uint64_t offset, uint64_t i) {
  Block b = philox4x32_10(offset + i / 2, seed);
  return bits64_of(b, static_cast<unsigned>(i % 2) * 2);
}

}  // namespace strata::philox
