// Writing a file so that a crash or an error never leaves a half-written file behind: the
// bytes go to a temporary file in the same folder, which is flushed, synced and renamed
// over the destination.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include <strata/core/export.hpp>

namespace strata::io {

/// A file being replaced atomically, for writers that stream: its bytes go to stream(), a
/// temporary beside the destination that holds an exclusive flock(2) from creation until it
/// is renamed. Opening one first removes the temporaries earlier writers of the same path left
/// when they were killed (remove_abandoned_temporaries). commit() flushes, fsyncs and renames
/// it over the destination, then fsyncs the folder; destruction or abandon() before that
/// removes the temporary and leaves the destination untouched. Errors raise strata::Error
/// naming `op`, the path and the system's reason; a failed commit also removes the temporary.
/// The stream must not be closed by the caller; seeking within it is fine.
class STRATA_API AtomicFile {
 public:
  /// Opens the temporary. `path` is resolved by atomic_destination, so a folder or device
  /// there is refused now, before anything is written.
  AtomicFile(const std::string& path, std::string_view op);
  ~AtomicFile() { abandon(); }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// The temporary's stream; null once committed or abandoned.
  std::FILE* stream() const { return file_; }
  /// Flushes and fsyncs the temporary without renaming it, so that what can fail for lack of
  /// space or an I/O error fails now (it then abandons, as commit does). Writers that replace
  /// several files sync them all before committing any.
  void sync();
  void commit();
  void abandon() noexcept;

 private:
  std::string path_, dest_, temp_, op_;
  std::FILE* file_ = nullptr;
  int lock_fd_ = -1;  // keeps the lock from the stream's fclose until the rename is done
};

/// Calls `write` with a temporary file opened in `path`'s folder, then flushes and fsyncs
/// it, renames it over `path` and fsyncs the folder. On any error (including an exception
/// from `write`, which is rethrown) the temporary is removed and `path` is untouched; I/O
/// failures raise strata::Error naming the path and the system's reason. `write` must not
/// close the FILE. The temporary is named "<folder>/<temporary_prefix(path)><pid>-<n>-<hex>"
/// (<pid> the writer's process id) and holds an exclusive flock(2) until it is renamed, so a
/// temporary left by a killed writer can be recognised and removed (remove_abandoned_temporaries).
/// A symbolic link is followed: the file it points to is replaced and the link
/// kept (see atomic_destination); a file that exists keeps its permission bits.
STRATA_API void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

/// The file an atomic write of `path` replaces: `path`, or the file a symbolic link there
/// points to. Raises strata::Error, naming `op`, when that exists and is not a regular file
/// (a folder, a device, a pipe), which a rename would replace rather than write to.
STRATA_API std::string atomic_destination(const std::string& path, std::string_view op);

/// The folder that holds `path`: its text up to the last '/', "/" for a file in the root, "."
/// for a bare name.
STRATA_API std::string folder_of(const std::string& path);

/// The start of the names of the temporaries written beside `path`: "." + the file name
/// (its first 100 bytes, so that the longest legal names still leave room) + ".tmp-".
STRATA_API std::string temporary_prefix(const std::string& path);

/// Removes the temporaries beside `path` whose writers died (killed mid-write): those nobody
/// holds a lock on. A live writer's temporary, in this process or another, is left alone.
/// Where a temporary cannot be locked (a filesystem without flock), its writer's process id
/// decides. Best effort: a folder that cannot be listed is not an error.
STRATA_API void remove_abandoned_temporaries(const std::string& path);

}  // namespace strata::io
