// Safetensors files (train/safetensors.h): the layout, truncated and corrupt files named,
// atomic writes that leave the previous file whole when the disk fills.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "train/safetensors.h"

using namespace eg;

namespace {
std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_safetensors_" + name); }
using eg::testing::slurp;
}  // namespace

TEST(Safetensors, RoundTripAndHeaderLayout) {
  std::string d = tmpdir("st");
  train::TensorMap m{{"a", Tensor::from_vector<float>({1, 2, 3}, {3})},
                     {"b", Tensor::from_vector<int64_t>({7, -8}, {2, 1})},
                     {"c", Tensor::from_vector<uint8_t>({9}, {1})}};
  train::save_safetensors(d + "/x.safetensors", m, {{"k", "v"}});
  train::Metadata meta;
  auto r = train::load_safetensors(d + "/x.safetensors", &meta);
  EXPECT_EQ(r.at("a").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(r.at("b").shape(), (Shape{2, 1}));
  EXPECT_EQ(r.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(meta.at("k"), "v");
  std::string raw = slurp(d + "/x.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(raw[size_t(i)])) << (8 * i);
  auto h = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["b"]["dtype"], "I64");
  EXPECT_EQ(raw.size(), 8 + n + 12 + 16 + 1);
}

TEST(Safetensors, TruncatedAndCorruptFilesAreNamed) {
  std::string d = tmpdir("st_bad");
  train::save_safetensors(d + "/x.safetensors", {{"a", Tensor::zeros({100})}});
  std::string raw = slurp(d + "/x.safetensors");
  std::ofstream(d + "/cut.safetensors", std::ios::binary) << raw.substr(0, raw.size() - 10);
  try {
    train::load_safetensors(d + "/cut.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cut.safetensors"), std::string::npos);
  }
  std::string bad = raw;
  bad[9] = '#';
  std::ofstream(d + "/bad.safetensors", std::ios::binary) << bad;
  EXPECT_THROW(train::load_safetensors(d + "/bad.safetensors"), Error);
  EXPECT_THROW(train::load_safetensors(d + "/none.safetensors"), Error);
  // What a user may point --resume, --init-from or eval at by mistake, named as such.
  EXPECT_NE(eg::testing::error_of([&] { train::load_safetensors(d); }).find("' is a directory, not a safetensors file"),
            std::string::npos);
  std::ofstream(d + "/text.safetensors") << "not a checkpoint at all";
  EXPECT_NE(eg::testing::error_of([&] {
              train::load_safetensors(d + "/text.safetensors");
            }).find("' is not a safetensors file, or is truncated: its first 8 bytes give a header of"),
            std::string::npos);
  const std::string header = R"({"__metadata__":{"epoch":5}})";
  std::string meta(8, '\0');
  for (int i = 0; i < 8; ++i) meta[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  std::ofstream(d + "/meta.safetensors", std::ios::binary) << meta + header;
  train::Metadata m;
  EXPECT_NE(eg::testing::error_of([&] {
              train::load_safetensors(d + "/meta.safetensors", &m);
            }).find("meta.safetensors' has a corrupt header: its metadata 'epoch' is not a string"),
            std::string::npos);
}

// A temporary file of a process killed while writing is removed by the next run in the
// directory; one of a running process (this one) is not.
TEST(Safetensors, StaleTemporaryFilesOfDeadProcessesAreRemoved) {
  const std::string d = tmpdir("st_stale");
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = d + "/checkpoint.safetensors.tmp." + std::to_string(dead);
  const std::string live = d + "/config.json.tmp." + std::to_string(::getpid());
  for (const std::string& f : {stale, live, d + "/notes.tmp.txt"}) std::ofstream(f) << "x";
  train::remove_stale_temporaries(d);
  EXPECT_FALSE(std::ifstream(stale).good());
  EXPECT_TRUE(std::ifstream(live).good());
  EXPECT_TRUE(std::ifstream(d + "/notes.tmp.txt").good());
}

TEST(Safetensors, AFailedWriteLeavesThePreviousFileIntact) {
  std::string d = tmpdir("st_full");
  const std::string p = d + "/w.safetensors";
  train::save_safetensors(p, {{"a", Tensor::ones({10})}});
  const std::string before = slurp(p);
  // Simulate a full disk: cap the size of files this process may write.
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit cap = old;
  cap.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &cap);
  std::string msg;
  try {
    train::save_safetensors(p, {{"a", Tensor::ones({100000})}});
  } catch (const Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_NE(msg.find("the previous file, if any, is unchanged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("over the process's file size limit, ulimit -f"), std::string::npos) << msg;
  EXPECT_EQ(slurp(p), before);
  EXPECT_EQ(std::system(("ls '" + d + "' | grep -q tmp").c_str()) == 0, false) << "temporary file left behind";
}
