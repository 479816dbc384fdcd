// Writing and mapping token shard files (format: docs/data.md). Multi-byte fields and tokens
// are little-endian; they are encoded byte by byte, so the writer is right on any host, and
// the reader decodes the same way.
#include <strata/data/token_shard.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <strata/core/error.hpp>
#include <strata/io/atomic_file.hpp>

namespace strata::data {
namespace {

void put_le(uint8_t* p, uint64_t v, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}

uint64_t get_le(const uint8_t* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t k = 0; k < bytes; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

bool valid_dtype(uint32_t code) { return code >= 1 && code <= 3; }

}  // namespace

size_t token_bytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kU8: return 1;
    case TokenDType::kU16: return 2;
    case TokenDType::kU32: return 4;
  }
  STRATA_CHECK(false, "[TokenShard] unknown token dtype code {}", static_cast<uint32_t>(dtype));
}

uint64_t token_max(TokenDType dtype) { return (uint64_t{1} << (8 * token_bytes(dtype))) - 1; }

// ---- writer ------------------------------------------------------------------------------

TokenShardWriter::TokenShardWriter(std::string path, TokenDType dtype) : path_(std::move(path)), dtype_(dtype) {
  STRATA_CHECK(valid_dtype(static_cast<uint32_t>(dtype)), "[TokenShardWriter] unknown token dtype code {}",
               static_cast<uint32_t>(dtype));
  file_ = std::make_unique<io::AtomicFile>(path_, "TokenShardWriter");  // removes killed writers' temporaries
  // Room for the header, written for real by close().
  uint8_t zeros[kTokenShardHeaderSize] = {};
  write(zeros, sizeof zeros, "the header");
}

TokenShardWriter::~TokenShardWriter() = default;

void TokenShardWriter::fail(const char* step) {
  int err = errno;
  file_.reset();  // removes the temporary
  STRATA_CHECK(false, "[TokenShardWriter] writing {} failed at {}: {}", path_, step, std::strerror(err));
}

void TokenShardWriter::write(const void* bytes, size_t size, const char* what) {
  if (size != 0 && std::fwrite(bytes, 1, size, file_->stream()) != size) fail(what);
}

void TokenShardWriter::append(std::span<const uint32_t> tokens) {
  STRATA_CHECK(file_ != nullptr, "[TokenShardWriter] {} is already closed", path_);
  STRATA_CHECK(!finished_, "[TokenShardWriter] {} is already finished", path_);
  size_t width = token_bytes(dtype_);
  uint64_t max = token_max(dtype_);
  std::vector<uint8_t> bytes(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    STRATA_CHECK(tokens[i] <= max, "[TokenShardWriter] token {} (position {} of this append) does not fit in {} bytes",
                 tokens[i], i, width);
    put_le(bytes.data() + i * width, tokens[i], width);
  }
  write(bytes.data(), bytes.size(), "tokens");
  count_ += static_cast<int64_t>(tokens.size());
}

void TokenShardWriter::finish() {
  STRATA_CHECK(file_ != nullptr, "[TokenShardWriter] {} is already closed", path_);
  STRATA_CHECK(!finished_, "[TokenShardWriter] {} is already finished", path_);
  uint8_t header[kTokenShardHeaderSize] = {};
  std::memcpy(header, kTokenShardMagic, 8);
  put_le(header + 8, kTokenShardVersion, 4);
  put_le(header + 12, static_cast<uint32_t>(dtype_), 4);
  put_le(header + 16, static_cast<uint64_t>(count_), 8);
  put_le(header + 24, kTokenShardHeaderSize, 8);
  if (std::fflush(file_->stream()) != 0) fail("fflush");  // the tokens still buffered
  if (std::fseek(file_->stream(), 0, SEEK_SET) != 0) fail("fseek");
  write(header, sizeof header, "the header");
  try {
    file_->sync();
  } catch (...) {
    file_.reset();  // sync abandoned the temporary: the writer is closed
    throw;
  }
  finished_ = true;
}

void TokenShardWriter::close() {
  STRATA_CHECK(file_ != nullptr, "[TokenShardWriter] {} is already closed", path_);
  if (!finished_) finish();
  std::unique_ptr<io::AtomicFile> file = std::move(file_);  // closed from here on, whatever commit does
  file->commit();
}

// ---- reader ------------------------------------------------------------------------------

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block: refused below
  STRATA_CHECK(fd >= 0, "[TokenShard] cannot open {}: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    STRATA_CHECK(false, "[TokenShard] {} is not a regular file", path_);
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < kTokenShardHeaderSize) {
    ::close(fd);
    STRATA_CHECK(false, "[TokenShard] {}: truncated header ({} bytes, the header alone is {})", path_, map_size_,
                 kTokenShardHeaderSize);
  }
  void* p = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  STRATA_CHECK(p != MAP_FAILED, "[TokenShard] cannot map {}: {}", path_, std::strerror(err));
  map_ = static_cast<const uint8_t*>(p);
  try {
    STRATA_CHECK(std::memcmp(map_, kTokenShardMagic, 8) == 0, "[TokenShard] {}: bad magic bytes (not a token shard)",
                 path_);
    auto version = static_cast<uint32_t>(get_le(map_ + 8, 4));
    STRATA_CHECK(version == kTokenShardVersion, "[TokenShard] {}: unsupported version {} (this build reads {})", path_,
                 version, kTokenShardVersion);
    auto code = static_cast<uint32_t>(get_le(map_ + 12, 4));
    STRATA_CHECK(valid_dtype(code), "[TokenShard] {}: unknown token dtype code {} (1 = u8, 2 = u16, 3 = u32)", path_,
                 code);
    dtype_ = static_cast<TokenDType>(code);
    uint64_t count = get_le(map_ + 16, 8);
    uint64_t header = get_le(map_ + 24, 8);
    STRATA_CHECK(header >= kTokenShardHeaderSize && header <= map_size_,
                 "[TokenShard] {}: header size {} is outside [{}, {}] (the file size)", path_, header,
                 kTokenShardHeaderSize, map_size_);
    uint64_t payload = map_size_ - header;
    uint64_t width = token_bytes(dtype_);
    STRATA_CHECK(count <= payload / width && count * width == payload,
                 "[TokenShard] {}: the header counts {} tokens of {} bytes but {} bytes follow it (truncated or "
                 "corrupt)",
                 path_, count, width, payload);
    count_ = static_cast<int64_t>(count);
    tokens_ = map_ + header;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

uint32_t TokenShard::at(int64_t i) const {
  STRATA_CHECK(i >= 0 && i < count_, "[TokenShard] token {} is outside [0, {}) of {}", i, count_, path_);
  size_t width = token_bytes(dtype_);
  return static_cast<uint32_t>(get_le(tokens_ + static_cast<size_t>(i) * width, width));
}

void TokenShard::read(int64_t start, int64_t count, int64_t* out) const {
  STRATA_CHECK(start >= 0 && count >= 0 && start <= count_ - count,
               "[TokenShard] {} tokens from {} are outside [0, {}) of {}", count, start, count_, path_);
  const uint8_t* p = tokens_ + static_cast<size_t>(start) * token_bytes(dtype_);
  switch (dtype_) {
    case TokenDType::kU8:
      for (int64_t i = 0; i < count; ++i) out[i] = p[i];
      break;
    case TokenDType::kU16:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(get_le(p + 2 * i, 2));
      break;
    case TokenDType::kU32:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(get_le(p + 4 * i, 4));
      break;
  }
}

}  // namespace strata::data
