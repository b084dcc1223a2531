// Small helpers shared by the tests that write files.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace eg::testing {

// An empty directory TempDir()/name (whatever was there is removed first).
inline std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A whole file as bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace eg::testing
