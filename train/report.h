// A finished run's freezing told for a person (`egeria report`): what froze at which step
// and why, what that saved, and the accuracy beside a run without freezing.
#pragma once
#include <string>

namespace eg::train {

// The report of the finished run in `dir`, from its summary.json, metrics.jsonl and
// freeze.jsonl:
// - each freezing decision with its reason: for Egeria the end of bootstrapping (the
//   training loss's change), each freeze (the slope of the unit's smoothed plasticity
//   against its tolerance T over the W readings that froze it) and each unfreeze (the
//   LR's fall); for the other policies their own criteria;
// - what it saved: backward FLOPs over the run, the median measured time a step took with
//   each frozen prefix (from the step lines' train_seconds), the training time those
//   steps saved at those medians, and the reference model's overhead;
// - the final accuracy (or BLEU and loss for translation), and with `against` (a run
//   directory or a summary.json, e.g. the same command with --freeze none) that run's
//   beside it. A summary.json may carry a "measured" string saying where and when it was
//   measured; the report quotes it.
// Throws eg::Error naming the file when the run has not finished or a file is unreadable.
std::string run_report(const std::string& dir, const std::string& against = "");

}  // namespace eg::train
