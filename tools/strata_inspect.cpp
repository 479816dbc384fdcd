// strata-inspect FILE...: validates safetensors files and lists, for each, its metadata and
// every tensor (name, dtype, shape, bytes, xxHash64 of the bytes). A bad file prints
// "strata-inspect: FILE: what is wrong" to stderr; the exit status is 1 if any file was bad.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <strata/io/safetensors.hpp>

namespace {

// The file's bytes through a read-only mapping, unmapped on scope exit.
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO is refused below, not waited on
    if (fd < 0) throw std::runtime_error(std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw std::runtime_error("not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error(std::string("cannot map: ") + std::strerror(err));
      data_ = p;
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data_) ::munmap(data_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Names and metadata come from the file: control bytes (a newline, a terminal escape) and
// backslashes are shown as \xNN and \\, so no file can break or forge a line of the listing.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else if (c == '\\') out += "\\\\";
    else out += c;
  }
  return out;
}

void inspect(const std::string& path) {
  Mapping file(path);
  strata::io::SafetensorsView view = strata::io::view_safetensors(file.data(), file.size());
  fmt::print("{}: {} bytes, header {} bytes, {} tensors\n", path, view.file_size, view.header_size,
             view.entries.size());
  if (!view.metadata.empty()) {
    fmt::print("metadata:\n");
    for (const auto& [k, v] : view.metadata) fmt::print("  {}: {}\n", printable(k), printable(v));
  }
  size_t width = 4;
  for (const auto& e : view.entries) width = std::max(width, printable(e.name).size());
  fmt::print("{:<{}}  {:<7}  {:<20}  {:>12}  {}\n", "name", width, "dtype", "shape", "bytes", "xxh64");
  for (const auto& e : view.entries) {
    uint64_t hash = XXH64(e.data, e.nbytes(), 0);
    fmt::print("{:<{}}  {:<7}  {:<20}  {:>12}  {:016x}\n", printable(e.name), width, e.dtype,
               fmt::format("[{}]", fmt::join(e.shape, ", ")),
               e.nbytes(), hash);
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "usage: strata-inspect FILE...\n  lists the tensors and metadata of safetensors files\n";
  if (argc < 2) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::printf("%s", kUsage);
      return 0;
    }
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    try {
      inspect(argv[i]);
    } catch (const std::exception& e) {
      std::fflush(stdout);  // the listings before it come first
      std::fprintf(stderr, "strata-inspect: %s: %s\n", argv[i], e.what());
      status = 1;
    }
  }
  // the listing is the tool's product: output that could not be written is an error
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "strata-inspect: cannot write to standard output: %s\n", std::strerror(errno));
    return 1;
  }
  return status;
}
