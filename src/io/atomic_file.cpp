// Atomic replacement of a file: write a temporary beside it, fsync, rename over, fsync the
// folder. rename(2) within one folder is atomic, so readers and crashes see the old file or
// the new one, and mappings of the old file stay valid (it keeps its inode).
#include <strata/io/atomic_file.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include <strata/core/error.hpp>

namespace strata::io {
namespace {

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Opens a fresh temporary beside `path` with O_EXCL; mode 0666 minus the umask, as a plain
// fopen would give the final file.
int open_temporary(const std::string& path, std::string& temp) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  std::string folder = folder_of(path);
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp = fmt::format("{}/.{}.tmp-{}-{}-{:08x}", folder, base, ::getpid(), counter++, rd());
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  STRATA_CHECK(!path.empty() && path.back() != '/', "[atomic_file] \"{}\" does not name a file", path);
  std::string temp;
  int fd = open_temporary(path, temp);
  STRATA_CHECK(fd >= 0, "[atomic_file] cannot create a temporary file for {}: {}", path, std::strerror(errno));
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    STRATA_CHECK(false, "[atomic_file] cannot open a stream for {}: {}", path, std::strerror(err));
  }
  auto abandon = [&] {
    if (f) std::fclose(f);
    f = nullptr;
    ::unlink(temp.c_str());
  };
  auto fail = [&](const char* step) {
    int err = errno;
    abandon();
    STRATA_CHECK(false, "[atomic_file] writing {} failed at {}: {}", path, step, std::strerror(err));
  };
  try {
    write(f);
  } catch (...) {
    abandon();
    throw;
  }
  if (std::ferror(f)) fail("write");
  if (std::fflush(f) != 0) fail("fflush");
  if (::fsync(::fileno(f)) != 0) fail("fsync");
  int rc = std::fclose(f);
  f = nullptr;
  if (rc != 0) fail("fclose");
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename");
  // Makes the rename itself durable; a folder that cannot be opened or synced (some
  // filesystems refuse) leaves the new file in place, so it is not an error.
  int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace strata::io
