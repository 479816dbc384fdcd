// A fresh, empty folder under the system's temporary folder (TMPDIR, else /tmp), removed with
// everything in it when the object goes out of scope, also when an assertion ends a test early.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <stdlib.h>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata_test") {
    std::string templ = std::filesystem::temp_directory_path().string() + "/" + prefix + "_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ignored;  // a destructor must not throw; a folder left behind is only litter
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& str() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace strata::testing
