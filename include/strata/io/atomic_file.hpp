// Writing a file so that a crash or an error never leaves a half-written file behind: the
// bytes go to a temporary file in the same folder, which is flushed, synced and renamed
// over the destination.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include <strata/core/export.hpp>

namespace strata::io {

/// Calls `write` with a temporary file opened in `path`'s folder, then flushes and fsyncs
/// it, renames it over `path` and fsyncs the folder. On any error (including an exception
/// from `write`, which is rethrown) the temporary is removed and `path` is untouched; I/O
/// failures raise strata::Error naming the path and the system's reason. The temporary is
/// named "<folder>/.<file>.tmp-<pid>-<n>-<hex>" (<pid> the writer's process id), so a
/// temporary left by a killed writer can be recognised and removed.
STRATA_API void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

}  // namespace strata::io
