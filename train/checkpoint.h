// A run's files: checkpoints (atomic, the newest N kept, resume falling back to an
// older one when the newest cannot be read) and the JSON-lines logs, cut back on resume
// to the lengths they had when the checkpoint was written.
//
// Note [Logs on resume]
// A checkpoint records the byte length of metrics.jsonl and freeze.jsonl at the moment
// it is written. A run killed later has appended lines past those lengths; --resume
// truncates each log to its recorded length before training on, so the resumed run
// appends the same lines the uninterrupted one did, once. Lengths, not "lines up to the
// checkpoint's step": a step checkpoint and an epoch's line can share a step.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "layers/module.h"
#include "train/init_from.h"
#include "train/safetensors.h"

namespace eg::train {

void make_dirs(const std::string& dir);
bool file_exists(const std::string& path);
// Appends one JSON line; throws naming the file when it cannot (disk full).
void append_json_line(const std::string& path, const nlohmann::json& line);

// A checkpoint's model tensors ("model/<name>"), named as the model names them, without
// the optimizer's and the policy's.
TensorMap model_tensors(const TensorMap& checkpoint);

struct Checkpoint {
  std::string path;
  TensorMap tensors;
  nlohmann::json state, config;
};

class Checkpoints {
 public:
  // The run directory `out`, keeping the newest `keep` checkpoints; `logs` are the
  // file names (in `out`) whose lengths each checkpoint records.
  Checkpoints(std::string out, int64_t keep, std::vector<std::string> logs);

  std::string newest_path() const { return out_ + "/checkpoint.safetensors"; }
  bool any() const;  // is there a checkpoint to resume from?
  // The files of an earlier run's results in the directory (checkpoints,
  // best.safetensors, model.safetensors, summary.json), by name: a new run refuses to
  // start over them (Note [A run directory is never overwritten] in train/run_setup.cpp).
  std::vector<std::string> results() const;
  // A fresh run in a directory without results(): empties the logs a run killed before
  // its first checkpoint left, so that none of them is taken for this run's.
  void start_fresh();
  // Loads the newest readable checkpoint, saying so when it falls back past one that
  // cannot be read (throws with every reason when none can). The logs are left as they
  // are until cut_logs(), once the resume has been checked. `who` begins its messages
  // (the flag or command that reads it).
  Checkpoint load(const std::string& who = "--resume");
  // Cuts the logs back to the lengths `ck` recorded (Note [Logs on resume]).
  void cut_logs(const Checkpoint& ck);
  // Writes a checkpoint of step `step` atomically, the logs' lengths added to `state`;
  // the previous one is kept as checkpoint-<step>.safetensors while fewer than `keep`.
  void save(const TensorMap& tensors, nlohmann::json state, const nlohmann::json& config, int64_t step);

 private:
  std::vector<std::pair<int64_t, std::string>> numbered() const;  // (step, path), newest first
  std::string out_;
  int64_t keep_;
  std::vector<std::string> logs_;
  int64_t last_step_ = -1;  // the step of checkpoint.safetensors, when this process knows it
};

}  // namespace eg::train
