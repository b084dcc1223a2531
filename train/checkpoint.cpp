#include "train/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace eg::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

void make_dirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        EG_THROW("cannot create output directory '", cur, "': ", std::strerror(errno));
    }
    if (i < dir.size()) cur += dir[i];
  }
  struct stat st {};
  EG_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--out '", dir,
           "' is not a directory (a file of that name is in the way)");
}

bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

TensorMap model_tensors(const TensorMap& checkpoint) {
  TensorMap model;
  for (auto& [k, t] : checkpoint)
    if (k.rfind("model/", 0) == 0) model[k.substr(6)] = t;
  return model;
}

void append_json_line(const std::string& path, const json& line) {
  std::ofstream f(path, std::ios::app);
  f << line.dump() << "\n";
  f.flush();
  EG_CHECK(f.good(), "cannot append to '", path, "' (disk full?)");
}

namespace {

int64_t file_size(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? int64_t(st.st_size) : -1;
}

// Cuts `path` back to its first `bytes` bytes, atomically (the prefix written to a new
// file that replaces it), so a crash here leaves either the old log or the cut one.
void truncate_log(const std::string& path, int64_t bytes) {
  const int64_t size = file_size(path);
  if (size == bytes) return;
  if (size < bytes) {
    std::printf(
        "warning: '%s' is shorter (%lld bytes) than when the checkpoint was written (%lld); it was changed "
        "since, and is continued as it is\n",
        path.c_str(), (long long)std::max<int64_t>(size, 0), (long long)bytes);
    return;
  }
  std::ifstream f(path, std::ios::binary);
  std::string head(size_t(bytes), '\0');
  f.read(head.data(), bytes);
  EG_CHECK(f.good(), "cannot read '", path, "' to cut it back to the checkpoint's ", bytes, " bytes");
  write_file_atomic(path, head);
}

Checkpoint read(const std::string& path) {
  Checkpoint c;
  c.path = path;
  Metadata meta;
  c.tensors = load_safetensors(path, &meta);
  EG_CHECK(meta.count("state") && meta.count("config"), "'", path, "' has no training state in its metadata (is it ",
           "a model.safetensors rather than a checkpoint?)");
  try {
    c.state = json::parse(meta.at("state"));
    c.config = json::parse(meta.at("config"));
  } catch (const json::exception& e) {
    EG_THROW("'", path, "' has a corrupt training state: ", e.what());
  }
  return c;
}

}  // namespace

Checkpoints::Checkpoints(std::string out, int64_t keep, std::vector<std::string> logs)
    : out_(std::move(out)), keep_(std::max<int64_t>(keep, 1)), logs_(std::move(logs)) {}

std::vector<std::pair<int64_t, std::string>> Checkpoints::numbered() const {
  std::vector<std::pair<int64_t, std::string>> r;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(out_, ec)) {
    const std::string name = e.path().filename().string();
    const std::string pre = "checkpoint-", post = ".safetensors";
    if (name.size() <= pre.size() + post.size() || name.rfind(pre, 0) != 0 ||
        name.compare(name.size() - post.size(), post.size(), post) != 0)
      continue;
    const std::string digits = name.substr(pre.size(), name.size() - pre.size() - post.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    r.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return r;
}

bool Checkpoints::any() const { return file_exists(newest_path()) || !numbered().empty(); }

std::vector<std::string> Checkpoints::results() const {
  std::vector<std::string> r;
  for (const char* f : {"checkpoint.safetensors", "best.safetensors", "model.safetensors", "summary.json"})
    if (file_exists(out_ + "/" + f)) r.push_back(f);
  for (auto& [step, p] : numbered()) r.push_back(fs::path(p).filename().string());
  return r;
}

void Checkpoints::start_fresh() {
  EG_CHECK(results().empty(), "a new run over an earlier run's results in '", out_, "'");
  for (auto& l : logs_) std::ofstream(out_ + "/" + l, std::ios::trunc);
  last_step_ = -1;
}

void Checkpoints::cut_logs(const Checkpoint& ck) {
  const json lengths = ck.state.value("log_bytes", json::object());
  for (auto& l : logs_)
    if (lengths.contains(l)) truncate_log(out_ + "/" + l, lengths[l].get<int64_t>());
}

Checkpoint Checkpoints::load(const std::string& who) {
  std::vector<std::string> paths;
  if (file_exists(newest_path())) paths.push_back(newest_path());
  for (auto& [step, p] : numbered()) paths.push_back(p);
  std::string reasons;
  for (size_t i = 0; i < paths.size(); ++i) {
    Checkpoint c;
    try {
      c = read(paths[i]);
    } catch (const Error& e) {
      reasons += std::string("\n  ") + e.what();
      std::printf("%s: '%s' cannot be read (%s)%s\n", who.c_str(), paths[i].c_str(), e.what(),
                  i + 1 < paths.size() ? "; trying the previous checkpoint" : "");
      continue;
    }
    if (i > 0)
      std::printf("%s: %s the older checkpoint '%s'\n", who.c_str(), who == "--resume" ? "resuming from" : "reading",
                  paths[i].c_str());
    last_step_ = i == 0 && paths[0] == newest_path() ? c.state.value("step", int64_t(-1)) : -1;
    return c;
  }
  EG_THROW(who, ": no checkpoint in '", out_, "' can be read:", reasons);
}

void Checkpoints::save(const TensorMap& tensors, json state, const json& config, int64_t step) {
  json lengths = json::object();
  for (auto& l : logs_) lengths[l] = std::max<int64_t>(file_size(out_ + "/" + l), 0);
  state["log_bytes"] = lengths;
  const std::string newest = newest_path();
  if (keep_ > 1 && last_step_ >= 0 && file_exists(newest)) {
    // The previous checkpoint keeps its data under its step's name: a hard link, so that
    // checkpoint.safetensors is complete at every moment (the new one replaces it by rename).
    const std::string kept = out_ + "/checkpoint-" + std::to_string(last_step_) + ".safetensors";
    std::remove(kept.c_str());
    EG_CHECK(::link(newest.c_str(), kept.c_str()) == 0, "cannot keep the previous checkpoint as '", kept,
             "': ", std::strerror(errno));
  }
  save_safetensors(newest, tensors, {{"state", state.dump()}, {"config", config.dump()}});
  last_step_ = step;
  auto old = numbered();
  for (size_t i = size_t(keep_ - 1); i < old.size(); ++i) std::remove(old[i].second.c_str());
}

}  // namespace eg::train
