// x % d for 64-bit x and a divisor fixed for many x, without a division (Lemire, Kaser and
// Kurz, "Faster remainder by direct computation", 2019): with M = ceil(2^128 / d), the
// remainder is the top 64 bits of ((M x) mod 2^128) d, exact for every 64-bit x and d >= 1
// (M wraps to 0 for d = 1, which gives 0). Four multiplies where a 64-bit division takes
// tens of cycles and keeps a loop around it from vectorizing.
#pragma once

#include <cstdint>

namespace strata::cpu {

class FastRemainder {
  __extension__ typedef unsigned __int128 Wide;

 public:
  explicit FastRemainder(uint64_t divisor) : m_(~Wide{0} / divisor + 1), d_(divisor) {}

  uint64_t operator()(uint64_t x) const {
    const Wide low_bits = m_ * x;  // the fraction x / d, in 128 bits
    const Wide low_part = static_cast<Wide>(static_cast<uint64_t>(low_bits)) * d_;
    const Wide product = static_cast<Wide>(static_cast<uint64_t>(low_bits >> 64)) * d_ + (low_part >> 64);
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  Wide m_;
  uint64_t d_;
};

}  // namespace strata::cpu
