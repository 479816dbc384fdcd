// Atomic replacement of a file: write a temporary beside it, fsync, rename over, fsync the
// folder. rename(2) within one folder is atomic, so readers and crashes see the old file or
// the new one, and mappings of the old file stay valid (it keeps its inode).
#include <strata/io/atomic_file.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <strata/core/error.hpp>

namespace strata::io {

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Note [Temporary locks]: a writer holds an exclusive flock on its temporary from creation
// to rename, and the lock dies with its process. A cleaner removes only temporaries it can
// lock itself, and unlinks while holding the lock. A cleaner may lock a temporary in the
// instant between its creation and its writer's flock; the writer then finds it unlinked
// (st_nlink 0) once it gets the lock, and starts over with a new name. Process ids alone
// cannot tell: a container's writer is often pid 1 in every run, and another host's pids mean
// nothing here.

int lock_exclusive(int fd) {
  int rc;
  do rc = ::flock(fd, LOCK_EX);
  while (rc != 0 && errno == EINTR);
  return rc;
}

// Opens a fresh temporary beside `path` with O_EXCL, locked; mode 0666 minus the umask, as a
// plain fopen would give the final file.
int open_temporary(const std::string& path, std::string& temp) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const std::string folder = folder_of(path), prefix = temporary_prefix(path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp = fmt::format("{}/{}{}-{}-{:08x}", folder, prefix, ::getpid(), counter++, rd());
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return fd;
    if (lock_exclusive(fd) != 0) return fd;  // no flock here: cleaners fall back to process ids
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_nlink > 0) return fd;
    ::close(fd);  // a cleaner took it before the lock
  }
  errno = EEXIST;
  return -1;
}

// Whether what follows the prefix is what open_temporary writes, "<pid>-<counter>-<8 hex>":
// a user's own file that happens to start with the prefix is never a temporary to remove.
bool temporary_suffix(std::string_view rest) {
  auto digits = [&rest](size_t min_count, size_t max_count, auto is_digit) {
    size_t n = 0;
    while (n < rest.size() && n < max_count && is_digit(rest[n])) ++n;
    if (n < min_count) return false;
    rest.remove_prefix(n);
    return true;
  };
  auto dash = [&rest] {
    if (rest.empty() || rest.front() != '-') return false;
    rest.remove_prefix(1);
    return true;
  };
  auto decimal = [](char c) { return c >= '0' && c <= '9'; };
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return digits(1, 20, decimal) && dash() && digits(1, 20, decimal) && dash() && digits(8, 8, hex) && rest.empty();
}

// A temporary no lock could be tried on: abandoned when its writer's process is gone.
bool writer_gone(std::string_view rest) {
  long pid = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || end == rest.data() || *end != '-' || pid <= 0) return false;
  if (pid == ::getpid()) return false;  // another thread of ours may be writing
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// Removes `file` if no writer holds it (Note [Temporary locks]).
void remove_if_abandoned(const std::string& file, std::string_view rest) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT && errno != ELOOP && writer_gone(rest)) ::unlink(file.c_str());
    return;
  }
  struct stat opened {}, named {};
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    // still the file that was opened: not renamed over, not replaced
    if (::fstat(fd, &opened) == 0 && ::lstat(file.c_str(), &named) == 0 && opened.st_ino == named.st_ino &&
        opened.st_dev == named.st_dev)
      ::unlink(file.c_str());
  } else if (errno != EWOULDBLOCK && writer_gone(rest)) {
    ::unlink(file.c_str());
  }
  ::close(fd);
}

}  // namespace

std::string temporary_prefix(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string_view base = std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  return fmt::format(".{}.tmp-", base.substr(0, 100));
}

void remove_abandoned_temporaries(const std::string& path) {
  const std::string dest = atomic_destination(path, "atomic_file");  // where the temporaries are
  const std::string folder = folder_of(dest), prefix = temporary_prefix(dest);
  DIR* dir = ::opendir(folder.c_str());
  if (!dir) return;  // a save will report an unusable folder
  std::vector<std::string> candidates;
  while (const dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name.substr(0, prefix.size()) == prefix && temporary_suffix(name.substr(prefix.size())))
      candidates.emplace_back(name);
  }
  ::closedir(dir);
  for (const std::string& name : candidates)
    remove_if_abandoned(folder + "/" + name, std::string_view(name).substr(prefix.size()));
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

AtomicFile::AtomicFile(const std::string& path, std::string_view op)
    : path_(path), dest_(atomic_destination(path, op)), op_(op) {
  // Temporaries of earlier writers of this path killed mid-write go first, so a writer killed
  // in turn leaves at most its own.
  try {
    remove_abandoned_temporaries(dest_);
  } catch (const std::exception&) {  // best effort: the write itself can go on
  }
  int fd = open_temporary(dest_, temp_);
  STRATA_CHECK(fd >= 0, "[{}] cannot create a temporary file for {}: {}", op_, path_, std::strerror(errno));
  struct stat old {};
  if (::stat(dest_.c_str(), &old) == 0) (void)::fchmod(fd, old.st_mode & 07777);  // a replaced file keeps its mode
  // The lock lives on the open file description; this duplicate keeps it held from the
  // stream's fclose until the rename is done.
  lock_fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  file_ = lock_fd_ >= 0 ? ::fdopen(fd, "wb") : nullptr;
  if (!file_) {
    int err = errno;
    ::close(fd);
    ::unlink(temp_.c_str());
    if (lock_fd_ >= 0) ::close(lock_fd_);
    STRATA_CHECK(false, "[{}] cannot open a stream for {}: {}", op_, path_, std::strerror(err));
  }
}

void AtomicFile::abandon() noexcept {
  if (lock_fd_ < 0) return;  // committed, or abandoned already
  if (file_) std::fclose(file_);
  file_ = nullptr;
  ::unlink(temp_.c_str());  // before the lock goes, so no cleaner meets a half-removed file
  ::close(lock_fd_);
  lock_fd_ = -1;
}

namespace {
// Abandons `file` (removing its temporary) and raises, naming the step that failed with errno.
[[noreturn]] void fail_write(AtomicFile& file, const std::string& op, const std::string& path, const char* step) {
  const int err = errno;
  file.abandon();
  throw Error(fmt::format("[{}] writing {} failed at {}: {}", op, path, step, std::strerror(err)));
}
}  // namespace

void AtomicFile::sync() {
  STRATA_CHECK(file_ != nullptr, "[{}] {} is already committed or abandoned", op_, path_);
  auto fail = [&](const char* step) { fail_write(*this, op_, path_, step); };
  if (std::ferror(file_)) fail("write");
  if (std::fflush(file_) != 0) fail("fflush");
  if (::fsync(::fileno(file_)) != 0) fail("fsync");
}

void AtomicFile::commit() {
  sync();
  auto fail = [&](const char* step) { fail_write(*this, op_, path_, step); };
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) fail("fclose");
  if (::rename(temp_.c_str(), dest_.c_str()) != 0) fail("rename");
  ::close(lock_fd_);
  lock_fd_ = -1;
  // Makes the rename itself durable; a folder that cannot be opened or synced (some
  // filesystems refuse) leaves the new file in place, so it is not an error.
  int dir = ::open(folder_of(dest_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  STRATA_CHECK(static_cast<bool>(write), "[atomic_file] no write function given for {}", path);
  AtomicFile file(path, "atomic_file");
  write(file.stream());  // an exception leaves the file to its destructor, which removes the temporary
  file.commit();
}

}  // namespace strata::io
