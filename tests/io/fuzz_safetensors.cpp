// libFuzzer target over parse_safetensors (built and run by scripts/fuzz.sh). Any input
// must either parse or raise strata::Error; a file that parses must survive a
// serialize -> parse -> serialize round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <strata/io/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::io::SafetensorsFile file;
  try {
    strata::io::view_safetensors(data, size);
    file = strata::io::parse_safetensors(data, size);
  } catch (const strata::Error&) {
    return 0;
  }
  std::vector<uint8_t> once = strata::io::serialize_safetensors(file.tensors, file.metadata);
  strata::io::SafetensorsFile again = strata::io::parse_safetensors(once.data(), once.size());
  if (strata::io::serialize_safetensors(again.tensors, again.metadata) != once) std::abort();
  return 0;
}
