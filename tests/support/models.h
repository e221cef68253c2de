// tests/support/models: where scripts/setup puts the tokenizer files of real models. A test that
// needs one fails (never skips) when it is missing: `make test` runs setup, which fetches them,
// so a missing file means a broken setup, and a skipped test would hide it.
#pragma once

#include <filesystem>
#include <string>

namespace kvgate::testing {

// <repo>/models (from the build's KVGATE_SOURCE_DIR, not __FILE__: ccache may rewrite that).
inline std::string models_dir() {
  return std::string(KVGATE_SOURCE_DIR) + "/models";
}

// "" when models/<name>/<file> exists, else the failure message to report.
inline std::string missing_model(const std::string& name,
                                 const std::string& file = "tokenizer.json") {
  std::string path = models_dir() + "/" + name + "/" + file;
  if (std::filesystem::exists(path)) return "";
  return path + " is missing: run scripts/setup (make test does)";
}

}  // namespace kvgate::testing

// Fails the test (returning from it) when a model file setup fetches is missing.
#define KVGATE_REQUIRE_MODEL(...)                                                \
  do {                                                                           \
    std::string kvgate_missing_ = ::kvgate::testing::missing_model(__VA_ARGS__); \
    ASSERT_TRUE(kvgate_missing_.empty()) << kvgate_missing_;                     \
  } while (0)
