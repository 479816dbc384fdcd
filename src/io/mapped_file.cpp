// mmap of a whole file. The mapping is MAP_PRIVATE with write permission so that in-place
// ops on loaded tensors work (pages are copied on first write) and never reach the file.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <strata/core/error.hpp>

namespace strata::io {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block: refused below
  STRATA_CHECK(fd >= 0, "[safetensors] cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    STRATA_CHECK(false, "[safetensors] cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    STRATA_CHECK(false, "[safetensors] {} is not a regular file", path);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    STRATA_CHECK(p != MAP_FAILED, "[safetensors] cannot map {}: {}", path, std::strerror(err));
    file->data_ = static_cast<uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace strata::io
