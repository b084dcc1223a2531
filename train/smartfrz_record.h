// --smartfrz-record on: the training data of SmartFRZ's predictor, recorded by any run
// (typically --freeze none). Every record_every steps, for every unit but the head: its
// tailored weights (Note [SmartFRZ's weight histories] in freeze/smartfrz.h) and the
// Gram matrix (probe x probe) of its output on a probe batch, the first `probe` samples
// of the run's first training batch, kept for the whole run (training data, never the
// test split), run in eval mode under no-grad. At the end the run's folder gets
// smartfrz-records.safetensors: "weights/U" [R, tailor], "grams/U" [R, probe, probe],
// "steps" [R], and in its metadata the model, the units, the run's length and whether it
// started from pretrained weights; "lrs" [R], record t's the mean LR of the steps since
// record t - 1 (Note [SmartFRZ's predictor input]). bench/train_smartfrz_predictor.py turns such files
// into the predictor (train/smartfrz_train.h). A checkpoint holds what was recorded so
// far, so a resumed run writes the uninterrupted run's file.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "freeze/smartfrz.h"
#include "models/model.h"

namespace eg::train {

inline constexpr const char* kSmartFrzRecordsFormat = "egeria-smartfrz-records-1";

class SmartFrzRecorder {
 public:
  SmartFrzRecorder(models::Model& m, const freeze::Partition& units, int64_t tailor, int64_t every, int64_t probe,
                   uint64_t seed, std::map<std::string, std::string> meta);
  bool has_probe() const { return probe_x_.defined(); }
  // The step's inputs (x2: a Transformer's target input ids): the first call's first
  // `probe` samples become the probe batch.
  void offer_probe(const Tensor& x, const Tensor& x2);
  void after_step(int64_t step, double lr);
  int64_t records() const { return int64_t(steps_.size()); }
  double seconds() const { return seconds_; }
  void save(std::map<std::string, Tensor>& tensors) const;  // under "smartfrz_record/"
  void load(const std::map<std::string, Tensor>& tensors);
  void write(const std::string& path) const;

 private:
  models::Model& m_;
  freeze::Partition part_;
  freeze::TailoredWeights tailored_;
  int64_t every_, probe_;
  std::map<std::string, std::string> meta_;
  Tensor probe_x_, probe_x2_;
  std::vector<int64_t> steps_;
  std::vector<float> lrs_;  // a record each
  bool lrs_complete_ = true;  // false: resumed from a checkpoint of records without them
  double lr_sum_ = 0;  // the steps' LRs since the last record
  int64_t lr_steps_ = 0;
  std::vector<std::vector<float>> weights_, grams_;  // a unit each, records appended
  double seconds_ = 0;
};

}  // namespace eg::train
