// egeria report (train/report.h) on a hand-made run whose every figure is known; a real
// run's report is checked in test_freeze_train.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/report.h"

namespace {

using json = nlohmann::json;

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void write_lines(const std::string& path, const std::vector<json>& lines) {
  std::ofstream f(path);
  for (auto& j : lines) f << j.dump() << "\n";
}

json evaluation(int64_t step, double slope, double tolerance, int64_t counter) {
  return {{"type", "evaluation"},
          {"step", step},
          {"epoch", 1},
          {"module", 0},
          {"counter", counter},
          {"window", 2},
          {"lr", 0.1},
          {"plasticity", 0.5},
          {"smoothed", 0.5},
          {"slope", slope},
          {"tolerance", tolerance > 0 ? json(tolerance) : json(nullptr)}};
}

// Step lines of 400 steps: nothing frozen for the first 200 at 100 ms a step, stem+layer1
// frozen from step 200 on at frozen_s a step.
void write_metrics(const std::string& d, double frozen_s) {
  std::vector<json> m;
  for (int64_t s = 50; s <= 200; s += 50)
    m.push_back(
        {{"type", "step"}, {"step", s}, {"epoch", 1}, {"frozen_modules", 0}, {"train_seconds", 0.1 * double(s)}});
  m.push_back({{"type", "freeze"}, {"step", 200}, {"epoch", 1}, {"frozen_modules", 1}, {"train_seconds", 20.0}});
  m.push_back({{"type", "epoch"}, {"epoch", 1}, {"step", 200}});
  for (int64_t s = 250; s <= 400; s += 50)
    m.push_back({{"type", "step"},
                 {"step", s},
                 {"epoch", 2},
                 {"frozen_modules", 1},
                 {"train_seconds", 20 + frozen_s * double(s - 200)}});
  write_lines(d + "/metrics.jsonl", m);
}

// 400 steps: nothing frozen for the first 200 at 100 ms a step, stem+layer1 frozen for the
// last 200 at 80 ms. Bootstrapping ends at step 150; the unit freezes at 200 after W = 2
// stale readings of the five every n = 10 steps.
// A directory of the test's own: ctest runs the Report tests in parallel processes.
std::string hand_made_run() {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string d = eg::testing::fresh_dir("eg_report_run_" + test);
  json units = json::array({{{"name", "stem+layer1"}, {"params", 100}},
                            {{"name", "layer2"}, {"params", 300}},
                            {{"name", "head"}, {"params", 600}}});
  json summary = {{"model", "resnet20"},
                  {"dataset", "fashion-mnist"},
                  {"steps", 400},
                  {"epochs", 2},
                  {"freeze", "egeria"},
                  {"freeze_units", units},
                  {"frozen_modules_final", 1},
                  {"frozen_fraction_final", 0.1},
                  {"backward_flops_saved_fraction", 0.2},
                  {"train_seconds", 36.0},
                  {"reference_overhead_fraction", 0.01},
                  {"freeze_stats", {{"interval", 10}, {"reference", "int8"}}},
                  {"final_test_accuracy", 0.9}};
  write(d + "/summary.json", summary.dump());
  write(d + "/config.json", json{{"freeze_tolerance", 0.2}}.dump());
  write_metrics(d, 0.08);
  std::vector<json> f = {
      {{"type", "bootstrap"}, {"step", 50}, {"epoch", 1}, {"loss", 0.8}, {"prev_loss", nullptr}, {"lr", 0.1}},
      {{"type", "bootstrap"}, {"step", 100}, {"epoch", 1}, {"loss", 0.5}, {"prev_loss", 0.8}, {"lr", 0.1}},
      {{"type", "bootstrap"}, {"step", 150}, {"epoch", 1}, {"loss", 0.48}, {"prev_loss", 0.5}, {"lr", 0.1}},
      evaluation(160, 0.004, 0, 0),
      evaluation(170, -0.005, 0, 0),
      evaluation(180, 0.003, 0, 0),
      evaluation(190, -0.0005, 0.001, 1),
      evaluation(200, 0.0003, 0.001, 2),
      {{"type", "freeze"}, {"step", 200}, {"epoch", 1}, {"module", 0}, {"counter", 2}, {"window", 2}, {"lr", 0.1}}};
  write_lines(d + "/freeze.jsonl", f);
  return d;
}

TEST(Report, SaysWhatFrozeWhyAndWhatItSaved) {
  const std::string d = hand_made_run();
  const std::string r = eg::train::run_report(d);
  auto has = [&](const std::string& s) { EXPECT_NE(r.find(s), std::string::npos) << "missing: " << s << "\n" << r; };
  has("resnet20 on fashion-mnist, 400 steps (2 epochs), --freeze egeria, 3 freezing units");
  has("every n = 10 steps");
  has("- step 150 (epoch 1): bootstrapping over: the mean training loss of the 50 steps before, 0.4800, changed by "
      "4.0% from the span before (0.5000), under 10%");
  has("- step 200 (epoch 1): froze stem+layer1 (10.0% of the parameters frozen now): the slope of its smoothed "
      "plasticity stayed under its tolerance T = 1.00e-03 (0.2 x the steepest of its first 3 slopes) for W = 2 "
      "readings in a row, steps 190-200 (|slope| 3.00e-04 to 5.00e-04)");
  has("- frozen at the end: stem+layer1 (1 of 2 units, 10.0% of the parameters)");
  has("20.0% of the backward FLOPs");
  has("a step took 100.0 ms (median) with nothing frozen, 80.0 ms with stem+layer1 frozen (200 steps, 1.25x)");
  has("took 4.0 s less than unfrozen ones would have, 10.0% of the 40.0 s");
  has("the reference model (int8) cost 1.0% of the training time");
  has("Accuracy: final test accuracy 90.00%, 36.0 s of training");
  // The early bootstrapping checks are not the one that ended it.
  EXPECT_EQ(r.find("step 100 (epoch 1)"), std::string::npos) << r;
}

// T from the steepest slope so far (--freeze-tolerance-from peak, or auto on a pretrained
// run): the run's freeze_stats say which, and a run from before they did, its config.
TEST(Report, SaysWhoseSlopesTheToleranceCameFrom) {
  const std::string d = hand_made_run();
  auto sum = json::parse(std::ifstream(d + "/summary.json"));
  sum["freeze_stats"]["tolerance_from"] = "peak";
  write(d + "/summary.json", sum.dump());
  const std::string want = "(0.2 x the steepest of its slopes so far)";
  EXPECT_NE(eg::train::run_report(d).find(want), std::string::npos) << eg::train::run_report(d);
  sum["freeze_stats"].erase("tolerance_from");
  write(d + "/summary.json", sum.dump());
  write(d + "/config.json", json{{"freeze_tolerance", 0.2}, {"freeze_tolerance_from", "peak"}}.dump());
  EXPECT_NE(eg::train::run_report(d).find(want), std::string::npos) << eg::train::run_report(d);
  write(d + "/config.json", json{{"freeze_tolerance", 0.2}, {"freeze_tolerance_from", "first3"}}.dump());
  EXPECT_NE(eg::train::run_report(d).find("(0.2 x the steepest of its first 3 slopes)"), std::string::npos);
}

TEST(Report, ClaimsNoSavingWhenNothingFroze) {
  const std::string d = hand_made_run();
  std::vector<json> m;
  for (int64_t s = 50; s <= 400; s += 50)
    m.push_back(
        {{"type", "step"}, {"step", s}, {"epoch", 1}, {"frozen_modules", 0}, {"train_seconds", 0.1 * double(s)}});
  write_lines(d + "/metrics.jsonl", m);
  const std::string r = eg::train::run_report(d);
  EXPECT_NE(r.find("a step took 100.0 ms (median) with nothing frozen; the reference"), std::string::npos) << r;
  EXPECT_EQ(r.find("frozen steps took"), std::string::npos) << r;
}

TEST(Report, SaysWhenFrozenStepsWereTimedSlower) {
  const std::string d = hand_made_run();
  write_metrics(d, 0.11);
  const std::string r = eg::train::run_report(d);
  EXPECT_NE(r.find("110.0 ms with stem+layer1 frozen (200 steps, 0.91x); at those medians the frozen steps took "
                   "2.0 s more than unfrozen ones would have"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("s less than"), std::string::npos) << r;
}

TEST(Report, PutsTheRunWithoutFreezingBesideIt) {
  const std::string d = hand_made_run();
  const std::string b = eg::testing::fresh_dir("eg_report_none");
  write(b + "/summary.json", json{{"model", "resnet20"},
                                  {"steps", 400},
                                  {"freeze", "none"},
                                  {"final_test_accuracy", 0.9025},
                                  {"train_seconds", 40.0},
                                  {"measured", "stored, 2026-11-25"}}
                                 .dump());
  const std::string r = eg::train::run_report(d, b);
  EXPECT_NE(r.find("beside --freeze none (" + b +
                   "/summary.json, stored, 2026-11-25): final test accuracy 90.25%, "
                   "40.0 s of training: -0.25 pt; its time was measured at another moment, so it is no gauge"),
            std::string::npos)
      << r;
  // A run beside it (no "measured"): the ratio of the training times.
  write(b + "/summary.json", json{{"model", "resnet20"},
                                  {"steps", 400},
                                  {"freeze", "none"},
                                  {"final_test_accuracy", 0.9025},
                                  {"train_seconds", 40.0}}
                                 .dump());
  EXPECT_NE(eg::train::run_report(d, b).find("-0.25 pt; speedup in training time 1.11x"), std::string::npos)
      << eg::train::run_report(d, b);
  // The same figures from the file itself; another run's length is called out.
  write(b + "/other.json", json{{"model", "resnet56"}, {"steps", 10}, {"freeze", "none"}}.dump());
  EXPECT_NE(eg::train::run_report(d, b + "/other.json").find("(not the same run: resnet56, 10 steps)"),
            std::string::npos);
}

TEST(Report, NamesWhatIsMissingOrBroken) {
  const std::string d = eg::testing::fresh_dir("eg_report_unfinished");
  try {
    eg::train::run_report(d);
    FAIL() << "no summary.json";
  } catch (const eg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the run has not finished"), std::string::npos) << e.what();
  }
  const std::string r = hand_made_run();
  std::ofstream(r + "/freeze.jsonl", std::ios::app) << "{\"type\": \"evalu\n";
  try {
    eg::train::run_report(r);
    FAIL() << "a broken line";
  } catch (const eg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 10 of '" + r + "/freeze.jsonl'"), std::string::npos) << e.what();
  }
  // A summary.json edited by hand, or another program's: named, not a json exception alone.
  const std::string h = hand_made_run();
  write(h + "/summary.json", "{}");
  EXPECT_NE(eg::testing::error_of([&] {
              eg::train::run_report(h);
            }).find("report: '" + h + "/summary.json' is not a summary egeria wrote"),
            std::string::npos);
  write(h + "/summary.json", json{{"model", 5}, {"steps", 400}}.dump());
  EXPECT_NE(eg::testing::error_of([&] { eg::train::run_report(h); })
                .find("report: a field in the files of '" + h +
                      "' (summary.json, config.json, the logs) is not what egeria writes there"),
            std::string::npos);
}

}  // namespace
