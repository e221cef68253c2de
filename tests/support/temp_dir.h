// tests/support/temp_dir: a directory for one test's files, removed with its contents when the
// test ends (KVGATE_KEEP_LOGS keeps it, to look at after a failure).
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace kvgate::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvgate-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!std::getenv("KVGATE_KEEP_LOGS")) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Writes `text` to the file `name` in the directory (replacing it); returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = *this / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }

 private:
  std::string path_;
};

}  // namespace kvgate::testing
