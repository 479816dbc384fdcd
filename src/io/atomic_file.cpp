// Atomic replacement of a file: write a temporary beside it, fsync, rename over, fsync the
// folder. rename(2) within one folder is atomic, so readers and crashes see the old file or
// the new one, and mappings of the old file stay valid (it keeps its inode).
#include <strata/io/atomic_file.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include <strata/core/error.hpp>

namespace strata::io {

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Opens a fresh temporary beside `path` with O_EXCL; mode 0666 minus the umask, as a plain
// fopen would give the final file.
int open_temporary(const std::string& path, std::string& temp) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const std::string folder = folder_of(path), prefix = temporary_prefix(path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp = fmt::format("{}/{}{}-{}-{:08x}", folder, prefix, ::getpid(), counter++, rd());
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

std::string temporary_prefix(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string_view base = std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  return fmt::format(".{}.tmp-", base.substr(0, 100));
}

std::string atomic_destination(const std::string& path, std::string_view op) {
  STRATA_CHECK(!path.empty() && path.back() != '/', "[{}] \"{}\" does not name a file", op, path);
  std::string dest = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char* real = ::realpath(path.c_str(), nullptr);  // null for a dangling link: the link is replaced
    if (real) {
      dest = real;
      std::free(real);
    }
  }
  if (::stat(dest.c_str(), &st) == 0)
    STRATA_CHECK(S_ISREG(st.st_mode), "[{}] {} exists and is not a regular file; it cannot be replaced", op, dest);
  return dest;
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  STRATA_CHECK(static_cast<bool>(write), "[atomic_file] no write function given for {}", path);
  const std::string dest = atomic_destination(path, "atomic_file");
  std::string temp;
  int fd = open_temporary(dest, temp);
  STRATA_CHECK(fd >= 0, "[atomic_file] cannot create a temporary file for {}: {}", path, std::strerror(errno));
  struct stat old {};
  if (::stat(dest.c_str(), &old) == 0) (void)::fchmod(fd, old.st_mode & 07777);  // a replaced file keeps its mode
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
  if (::rename(temp.c_str(), dest.c_str()) != 0) fail("rename");
  // Makes the rename itself durable; a folder that cannot be opened or synced (some
  // filesystems refuse) leaves the new file in place, so it is not an error.
  int dir = ::open(folder_of(dest).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace strata::io
