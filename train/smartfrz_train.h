// SmartFRZ's predictor, trained offline by egeria from runs' smartfrz-records.safetensors
// (train/smartfrz_record.h): `egeria smartfrz-train`, driven by
// bench/train_smartfrz_predictor.py.
//
// Note [SmartFRZ's labels]
// A unit's label at record t says whether it could have frozen there: its representation
// is already, and stays, what the run ends with. The measure is linear CKA (Kornblith et
// al. 2019) between the unit's output on the run's probe batch (training samples) at
// record t and at the run's last record, from their centred Grams:
// CKA = <HKH, HLH> / (|HKH| |HLH|). The unit is labelled "freeze" from the first record
// after which its CKA never falls below 1 - tolerance again, "keep" before. So a label
// depends on the whole run, which is what the predictor must learn to foresee from the
// weights' recent history alone. The tolerance is chosen by measurement
// (docs/results/, the predictor's page).
//
// A sample is a unit's window of `window` records ending at record t (features as Note
// [SmartFRZ's predictor input]), labelled as record t. `gain` is set from the training
// samples so that their features have unit RMS, and goes into the predictor's file.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "freeze/smartfrz.h"

namespace eg::train {

struct SmartFrzTrainOptions {
  std::vector<std::string> records;  // smartfrz-records.safetensors files
  std::string hold_out;  // a model name: its runs are left out of training and evaluated
  std::string out;  // the predictor file to write (empty: none)
  int64_t window = 30;
  double cka_tolerance = 0.02;
  int64_t stride = 1;  // a sample every `stride` records
  int64_t epochs = 8, batch_size = 64;
  double lr = 1e-3, grad_clip = 1.0;
  uint64_t seed = 0;
  freeze::SmartFrzGeometry geometry;  // its tailor and window are the records' and `window`
};

// The linear CKA of two n x n Grams (Note [SmartFRZ's labels]).
double linear_cka(const std::vector<float>& k, const std::vector<float>& l, int64_t n);

// The records labelled, the predictor trained on the runs not held out, evaluated on
// both (precision and recall of "freeze", at P >= 0.5), and written to `out`. Returns the
// figures, the labels' CKA curves and the per-run positive shares.
nlohmann::json train_smartfrz_predictor(const SmartFrzTrainOptions& o);

}  // namespace eg::train
