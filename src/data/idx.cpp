// IDX reading and writing (plain or gzip, through zlib) and IdxDataset. The body is read in
// chunks, so a header that declares more data than the file holds fails at the end of the
// file instead of allocating what the header claims.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <strata/data/idx.hpp>
#include <strata/io/atomic_file.hpp>
#include <strata/ops/creation.hpp>

#include <fmt/ranges.h>

namespace strata::data {
namespace {

constexpr uint8_t kUByte = 0x08;
constexpr int kMaxDims = 8;
constexpr int64_t kMaxBytes = int64_t{1} << 40;  // a sanity bound on the declared size
constexpr size_t kChunk = size_t{16} << 20;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads up to n bytes; raises on a zlib error (a corrupt or truncated gzip stream).
size_t read_some(gzFile f, uint8_t* dst, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const auto want = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
    const int got = gzread(f, dst + done, want);
    int errnum = Z_OK;
    const char* msg = gzerror(f, &errnum);
    if (got < 0 || (errnum != Z_OK && errnum != Z_STREAM_END)) {
      std::string why = errnum == Z_ERRNO ? std::strerror(errno) : msg;
      if (why.starts_with(path + ": ")) why.erase(0, path.size() + 2);  // zlib prefixes the path
      STRATA_CHECK(false, "[read_idx] {}: corrupt or truncated data ({})", path, why);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

Tensor read_idx(const std::string& path) {
  // opened without blocking and checked to be a regular file: a FIFO or a device would make
  // the read wait for a writer, or never end
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  STRATA_CHECK(fd >= 0, "[read_idx] cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    STRATA_CHECK(false, "[read_idx] {} is not a regular file", path);
  }
  GzFile f(gzdopen(fd, "rb"));
  if (!f) ::close(fd);
  STRATA_CHECK(f != nullptr, "[read_idx] cannot open {}: {}", path, std::strerror(errno));
  uint8_t magic[4];
  STRATA_CHECK(read_some(f.get(), magic, 4, path) == 4, "[read_idx] {}: truncated header", path);
  STRATA_CHECK(magic[0] == 0 && magic[1] == 0, "[read_idx] {}: bad magic {:02x}{:02x}{:02x}{:02x}, not an IDX file",
               path, magic[0], magic[1], magic[2], magic[3]);
  STRATA_CHECK(magic[2] == kUByte, "[read_idx] {}: data type 0x{:02x} is not supported (only unsigned byte, 0x08)",
               path, magic[2]);
  const int ndim = magic[3];
  STRATA_CHECK(ndim >= 1 && ndim <= kMaxDims, "[read_idx] {}: {} dims (1 to {} supported)", path, ndim, kMaxDims);
  uint8_t raw[4 * kMaxDims];
  STRATA_CHECK(read_some(f.get(), raw, 4 * static_cast<size_t>(ndim), path) == 4 * static_cast<size_t>(ndim),
               "[read_idx] {}: truncated header (dims)", path);
  Shape shape;
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t* b = raw + 4 * d;
    const int64_t n = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    shape.push_back(n);
    STRATA_CHECK(n == 0 || total <= kMaxBytes / n, "[read_idx] {}: declared dims {} exceed {} bytes", path, shape,
                 kMaxBytes);
    total *= n;
  }
  std::vector<uint8_t> body;
  while (static_cast<int64_t>(body.size()) < total) {
    const size_t old = body.size();
    const size_t want = std::min<size_t>(kChunk, static_cast<size_t>(total) - old);
    body.resize(old + want);
    const size_t got = read_some(f.get(), body.data() + old, want, path);
    STRATA_CHECK(got == want, "[read_idx] {}: truncated: dims {} need {} bytes of data, the file has {}", path, shape,
                 total, old + got);
  }
  uint8_t extra;
  STRATA_CHECK(read_some(f.get(), &extra, 1, path) == 0,
               "[read_idx] {}: trailing bytes after the {} bytes that dims {} declare", path, total, shape);
  Tensor t = empty(shape, kUInt8);
  if (total > 0) std::memcpy(t.data(), body.data(), static_cast<size_t>(total));
  return t;
}

void write_idx(const std::string& path, const Tensor& t, bool gzip) {
  STRATA_CHECK(t.dtype() == kUInt8 && t.dim() >= 1 && t.dim() <= kMaxDims,
               "[write_idx] {}: expects a uint8 tensor with 1 to {} dims, got {} of shape {}", path, kMaxDims,
               t.dtype(), t.shape());
  const Tensor c = t.cpu().contiguous();
  std::vector<uint8_t> bytes = {0, 0, kUByte, static_cast<uint8_t>(t.dim())};
  for (int64_t n : c.shape()) {
    STRATA_CHECK(n <= 0xFFFFFFFFll, "[write_idx] {}: dim {} does not fit in 32 bits", path, n);
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<uint8_t>(n >> s));
  }
  const auto* data = static_cast<const uint8_t*>(c.data());
  bytes.insert(bytes.end(), data, data + c.numel());
  if (gzip) {
    z_stream zs{};
    STRATA_CHECK(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
                 "[write_idx] {}: cannot start gzip compression", path);
    // zlib counts bytes in 32 bits: the input goes in 64 MiB pieces, the output comes out in 16 MiB ones
    constexpr size_t kInChunk = size_t(64) << 20, kOutChunk = size_t(16) << 20;
    std::vector<uint8_t> out;
    size_t fed = 0;
    int rc = Z_OK;
    while (rc == Z_OK || rc == Z_BUF_ERROR) {
      if (zs.avail_in == 0 && fed < bytes.size()) {
        const size_t n = std::min(kInChunk, bytes.size() - fed);
        zs.next_in = bytes.data() + fed;
        zs.avail_in = static_cast<uInt>(n);
        fed += n;
      }
      const size_t done = out.size();
      out.resize(done + kOutChunk);
      zs.next_out = out.data() + done;
      zs.avail_out = static_cast<uInt>(kOutChunk);
      rc = deflate(&zs, fed == bytes.size() ? Z_FINISH : Z_NO_FLUSH);
      out.resize(out.size() - zs.avail_out);
    }
    deflateEnd(&zs);
    STRATA_CHECK(rc == Z_STREAM_END, "[write_idx] {}: gzip compression failed ({})", path, rc);
    bytes = std::move(out);
  }
  io::write_file_atomically(path, [&](std::FILE* file) {
    STRATA_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size(), "[write_idx] {}: write failed",
                 path);
  });
}

std::string fashion_mnist_dir() {
  if (const char* env = std::getenv("STRATA_FASHION_MNIST_DIR"); env && *env) return env;
  return "/usr/share/datasets/fashion-mnist";
}

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path) {
  images_ = read_idx(images_path);
  const Tensor labels = read_idx(labels_path);
  STRATA_CHECK(images_.dim() == 3, "[IdxDataset] {}: images must have 3 dims (N, H, W), got {}", images_path,
               images_.shape());
  STRATA_CHECK(labels.dim() == 1, "[IdxDataset] {}: labels must have 1 dim (N), got {}", labels_path, labels.shape());
  STRATA_CHECK(labels.size(0) == images_.size(0), "[IdxDataset] {} holds {} images but {} holds {} labels",
               images_path, images_.size(0), labels_path, labels.size(0));
  labels_ = labels.to(kInt64);
}

IdxDataset IdxDataset::fashion_mnist(bool train, const std::string& dir) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  return IdxDataset(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz");
}

Example IdxDataset::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size(), "[IdxDataset] index {} out of range for {} samples", index, size());
  const int64_t H = images_.size(1), W = images_.size(2);
  Tensor input = empty({1, H, W}, kFloat32);
  const uint8_t* src = static_cast<const uint8_t*>(images_.data()) + index * H * W;
  float* dst = input.data_ptr<float>();
  for (int64_t k = 0; k < H * W; ++k) dst[k] = src[k] / 255.0f;
  return {std::move(input), scalar_tensor(labels_.data_ptr<int64_t>()[index], kInt64)};
}

}  // namespace strata::data
