// libFuzzer target over read_idx (built and run by scripts/fuzz.sh). The input is served as a
// file through a memfd, since read_idx reads paths (plain or gzip through zlib). Any input
// must either load or raise strata::Error; a file that loads must hold exactly the bytes its
// dims promise, and write_idx of it must load back equal.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <strata/data/idx.hpp>

#include "temp_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = memfd_create("idx", 0);
  if (fd < 0) std::abort();
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  strata::Tensor t;
  try {
    t = strata::data::read_idx(path);
  } catch (const strata::Error&) {
    close(fd);
    return 0;
  }
  close(fd);
  if (t.dtype() != strata::kUInt8 || !t.is_contiguous()) std::abort();
  // write_idx replaces files atomically (rename), so it needs a real folder
  static const strata::testing::TempDir folder("strata-fuzz-idx");  // removed when the fuzzer exits
  static const std::string again_path = folder / "again.idx";
  strata::data::write_idx(again_path, t);
  strata::Tensor back = strata::data::read_idx(again_path);
  if (back.shape() != t.shape()) std::abort();
  if (t.nbytes() > 0 && std::memcmp(back.data(), t.data(), t.nbytes()) != 0) std::abort();
  return 0;
}
