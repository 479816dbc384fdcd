// Where a tensor's storage lives.
#pragma once

#include <cstdint>

#include <fmt/format.h>

#include <strata/core/export.hpp>

namespace strata {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr Device cpu() { return Device{DeviceType::CPU, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }
  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  constexpr bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

inline constexpr Device kCPU = Device::cpu();

namespace cuda {
/// True when strata was built with CUDA and at least one GPU is visible.
STRATA_API bool is_available();
/// Number of visible GPUs (0 in a build without CUDA).
STRATA_API int device_count();
}  // namespace cuda

}  // namespace strata

template <>
struct fmt::formatter<strata::Device> : fmt::formatter<std::string_view> {
  auto format(strata::Device d, fmt::format_context& ctx) const {
    if (d.is_cpu()) return fmt::formatter<std::string_view>::format("cpu", ctx);
    return fmt::format_to(ctx.out(), "cuda:{}", d.index);
  }
};
