// data/idx: bad files are reported with their path and the problem.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>

#include "data/idx.h"

using namespace eg;

namespace {
std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "/eg_idx_" + name; }

void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<uint8_t> idx_labels(std::vector<uint8_t> labels) {
  std::vector<uint8_t> b(8 + labels.size());
  b[2] = 8;
  b[3] = 1;
  b[7] = uint8_t(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) b[8 + i] = labels[i];
  return b;
}

std::string error_of(const std::string& p) {
  try {
    data::read_idx(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(DataIdx, ReadsPlainAndGzip) {
  std::string p = tmp_path("ok");
  write_bytes(p, idx_labels({1, 2, 3}));
  EXPECT_EQ(data::read_idx(p).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 2, 3}));
  std::string gz = tmp_path("ok.gz");
  gzFile f = gzopen(gz.c_str(), "wb");
  auto b = idx_labels({7, 9});
  gzwrite(f, b.data(), unsigned(b.size()));
  gzclose(f);
  EXPECT_EQ(data::read_idx(gz).to_vector<uint8_t>(), (std::vector<uint8_t>{7, 9}));
}

TEST(DataIdx, NamesTheProblem) {
  EXPECT_NE(error_of(tmp_path("nope")).find("no such file"), std::string::npos);
  std::string p = tmp_path("bad");
  write_bytes(p, {1, 2, 8, 1, 0, 0, 0, 1, 5});
  EXPECT_NE(error_of(p).find("bad magic number"), std::string::npos) << error_of(p);
  auto t = idx_labels({1, 2, 3});
  t.pop_back();
  write_bytes(p, t);
  std::string msg = error_of(p);
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  write_bytes(p, {0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  EXPECT_NE(error_of(p).find("only unsigned bytes"), std::string::npos);
}

TEST(DataIdx, LabelRangeAndCountsChecked) {
  std::string dir = ::testing::TempDir();
  write_bytes(dir + "/eg-images-idx3-ubyte", {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 10, 20});
  write_bytes(dir + "/eg-labels-idx1-ubyte", idx_labels({3, 12}));
  try {
    data::load_mnist_split(dir, "eg", 10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 12 at index 1"), std::string::npos) << e.what();
  }
  write_bytes(dir + "/eg-labels-idx1-ubyte", idx_labels({3}));
  EXPECT_THROW(data::load_mnist_split(dir, "eg", 10), Error);
  std::remove((dir + "/eg-labels-idx1-ubyte").c_str());
  EXPECT_THROW(data::load_mnist_split(dir, "eg", 10), Error);
}
