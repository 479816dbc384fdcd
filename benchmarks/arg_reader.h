// Flag reading shared by the benchmark programs: the value after a flag, and a bounded
// integer, each reported through the program's own usage(), which prints why and exits 2.
#pragma once

#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace bench {

class ArgReader {
 public:
  using Usage = void (*)(const std::string& why);  // prints the message and the usage, exits

  ArgReader(int argc, char** argv, Usage usage) : argc_(argc), argv_(argv), usage_(usage) {}

  /// The value after flag argv[i]; i moves to it.
  std::string value(int& i) const {
    if (i + 1 >= argc_) fail(fmt::format("{} needs a value", argv_[i]));
    return argv_[++i];
  }

  /// The value after flag argv[i] as an integer in [min, max]; i moves to it.
  int count(int& i, int min, long max) const {
    const std::string flag = argv_[i], v = value(i);
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < min || n > max)
      fail(fmt::format("{} takes an integer >= {}, not '{}'", flag, min, v));
    return static_cast<int>(n);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    usage_(why);
    std::exit(2);
  }

  int argc_;
  char** argv_;
  Usage usage_;
};

}  // namespace bench
