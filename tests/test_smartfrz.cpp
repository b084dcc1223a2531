// SmartFRZ (freeze/smartfrz.h, freeze/policy_smartfrz.cpp): the predictor against a plain
// implementation, its input, the tailored positions, the predictor file, and the policy
// through the trainer (orders, logs, resume, background against inline, bad input).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "freeze/smartfrz.h"
#include "tests/test_util.h"
#include "train/freezing.h"
#include "train/report.h"
#include "train/safetensors.h"
#include "train/smartfrz_record.h"
#include "train/smartfrz_train.h"
#include "train/trainer.h"

namespace eg {
namespace {

using json = nlohmann::json;

freeze::SmartFrzGeometry small_geometry() {
  freeze::SmartFrzGeometry g;
  g.tailor = 24;
  g.hidden = 12;
  g.dim = 8;
  g.head = 6;
  g.window = 5;
  g.gain = 50;
  return g;
}

// ---- a plain implementation of Note [SmartFRZ's predictor]
using Vec = std::vector<double>;
Vec linear(const std::map<std::string, Tensor>& sd, const std::string& name, const Vec& x) {
  const Tensor& w = sd.at(name + ".weight");
  const std::vector<float> wv = w.to_vector<float>(), bv = sd.at(name + ".bias").to_vector<float>();
  const int64_t out = w.size(0), in = w.size(1);
  Vec y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = bv[size_t(o)];
    for (int64_t i = 0; i < in; ++i) s += double(wv[size_t(o * in + i)]) * x[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}
Vec relu(Vec v) {
  for (double& x : v) x = std::max(0.0, x);
  return v;
}
Vec mlp(const std::map<std::string, Tensor>& sd, const std::string& n, const Vec& x) {
  return linear(sd, n + ".4", relu(linear(sd, n + ".2", relu(linear(sd, n + ".0", x)))));
}
// One window [M][T] -> the two logits.
Vec reference_logits(const std::map<std::string, Tensor>& sd, const std::vector<Vec>& rows, int64_t dim) {
  const size_t m = rows.size();
  const Vec q = mlp(sd, "query", rows[m - 1]);
  std::vector<Vec> k, v;
  for (size_t j = 0; j + 1 < m; ++j) k.push_back(mlp(sd, "key", rows[j])), v.push_back(mlp(sd, "value", rows[j]));
  Vec score(m - 1);
  double top = -1e300;
  for (size_t j = 0; j + 1 < m; ++j) {
    double s = 0;
    for (size_t d = 0; d < q.size(); ++d) s += q[d] * k[j][d];
    score[j] = s / std::sqrt(double(dim));
    top = std::max(top, score[j]);
  }
  double z = 0;
  for (double& s : score) z += (s = std::exp(s - top));
  Vec ctx(q.size(), 0.0);
  for (size_t j = 0; j + 1 < m; ++j)
    for (size_t d = 0; d < q.size(); ++d) ctx[d] += score[j] / z * v[j][d];
  return mlp(sd, "head", ctx);
}

TEST(SmartFrz, PredictorMatchesAPlainImplementationPerSample) {
  const auto g = small_geometry();
  Generator gen(3);
  freeze::SmartFrzPredictor p(g, gen);
  p.eval();
  const int64_t b = 3, m = 5;
  Tensor w = Tensor::randn({b, m, g.tailor}, gen);
  const std::vector<float> wv = w.to_vector<float>();
  const std::vector<float> got = p.forward(w).to_vector<float>();
  ASSERT_EQ(got.size(), size_t(b * 2));
  const auto sd = p.state_dict();
  for (int64_t i = 0; i < b; ++i) {
    std::vector<Vec> rows;
    for (int64_t r = 0; r < m; ++r)
      rows.emplace_back(wv.begin() + (i * m + r) * g.tailor, wv.begin() + (i * m + r + 1) * g.tailor);
    const Vec want = reference_logits(sd, rows, g.dim);
    for (int c = 0; c < 2; ++c)
      EXPECT_NEAR(got[size_t(i * 2 + c)], want[size_t(c)], 1e-4 * std::max(1.0, std::abs(want[size_t(c)])))
          << "sample " << i << " logit " << c;
  }
  // Attention is per sample: a sample's answer does not depend on the others in the batch.
  const std::vector<float> alone =
      p.forward(Tensor::from_vector(std::vector<float>(wv.begin(), wv.begin() + m * g.tailor), {1, m, g.tailor}))
          .to_vector<float>();
  EXPECT_NEAR(alone[0], got[0], 1e-5);
  EXPECT_NEAR(alone[1], got[1], 1e-5);
  const auto pf = p.freeze_probability(w);
  ASSERT_EQ(pf.size(), size_t(b));
  for (int64_t i = 0; i < b; ++i)
    EXPECT_NEAR(pf[size_t(i)], 1 / (1 + std::exp(double(got[size_t(i * 2)] - got[size_t(i * 2 + 1)]))), 1e-6);
  EXPECT_THROW(p.forward(Tensor::randn({b, 1, g.tailor}, gen)), Error);  // one record: no key
  EXPECT_THROW(p.forward(Tensor::randn({b, m, g.tailor + 1}, gen)), Error);
}

TEST(SmartFrz, ItsInputIsTheMovementWithinTheWindowRelativeToTheWeightsSize) {
  // 3 records of 2 weights: the first moves 0.1 -> 0.3, the second stands at -0.4.
  const Tensor r = Tensor::from_vector(std::vector<float>{0.1f, -0.4f, 0.2f, -0.4f, 0.3f, -0.4f}, {3, 2});
  const std::vector<float> f = freeze::smartfrz_features(r, 10).to_vector<float>();
  const double rms = std::sqrt((0.3 * 0.3 + 0.4 * 0.4) / 2);
  const double want[6] = {-0.1 / rms * 10, 0, 0, 0, 0.1 / rms * 10, 0};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(f[size_t(i)], want[i], 1e-5) << i;
  // Scaling the weights changes nothing.
  const Tensor r2 = Tensor::from_vector(std::vector<float>{1, -4, 2, -4, 3, -4}, {3, 2});
  const std::vector<float> f2 = freeze::smartfrz_features(r2, 10).to_vector<float>();
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(f2[size_t(i)], want[i], 1e-4) << i;
}

TEST(SmartFrz, PerLrItsInputIsThePathWithEachStepDividedByItsLr) {
  // 5 records of 2 weights. The first moves by 0.1 a step at LR 0.1, then 0.01 at LR
  // 0.01 (per unit of LR the same steps: a path 0, 1, 2, 3), then stands; the second
  // moves only in the step of LR 0, which adds nothing.
  const Tensor r =
      Tensor::from_vector(std::vector<float>{0.0f, 0.5f, 0.1f, 0.5f, 0.2f, 0.5f, 0.21f, 0.5f, 0.21f, 0.7f}, {5, 2});
  const std::vector<float> lrs = {123.0f, 0.1f, 0.1f, 0.01f, 0.0f};  // the oldest record's is unused
  const std::vector<float> f = freeze::smartfrz_features(r, 10, lrs).to_vector<float>();
  const double rms = std::sqrt((0.21 * 0.21 + 0.7 * 0.7) / 2), s = 10 / rms;
  const double want[10] = {-1.8 * s, 0, -0.8 * s, 0, 0.2 * s, 0, 1.2 * s, 0, 1.2 * s, 0};
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(f[size_t(i)], want[i], 1e-4) << i;
  // movement (no LRs) reads the raw path: the fourth step a tenth of the others.
  const std::vector<float> m = freeze::smartfrz_features(r, 10).to_vector<float>();
  EXPECT_NEAR(m[6] - m[4], 0.01 * s, 1e-4);
  EXPECT_NEAR(m[9] - m[7], 0.2 * s, 1e-4);
  EXPECT_THROW(freeze::smartfrz_features(r, 10, {0.1f, 0.1f}), Error);  // an LR per record
}

TEST(SmartFrz, TailoredPositionsAreFixedBySeedAndUnitAndCoverSmallUnits) {
  const std::vector<int64_t> numels = {300, 50, 4000};
  const auto a = freeze::tailor_positions(numels, 256, 7, 2), b = freeze::tailor_positions(numels, 256, 7, 2);
  const auto c = freeze::tailor_positions(numels, 256, 7, 3), d = freeze::tailor_positions(numels, 256, 8, 2);
  ASSERT_EQ(a.size(), 256u);
  std::set<std::pair<int64_t, int64_t>> seen;
  int64_t same_c = 0, same_d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].param, b[i].param);
    EXPECT_EQ(a[i].offset, b[i].offset);
    ASSERT_GE(a[i].param, 0);
    ASSERT_LT(a[i].param, 3);
    ASSERT_GE(a[i].offset, 0);
    ASSERT_LT(a[i].offset, numels[size_t(a[i].param)]);
    seen.insert({a[i].param, a[i].offset});
    same_c += a[i].param == c[i].param && a[i].offset == c[i].offset;
    same_d += a[i].param == d[i].param && a[i].offset == d[i].offset;
  }
  EXPECT_EQ(seen.size(), 256u) << "drawn without replacement where the unit has enough weights";
  EXPECT_LT(same_c, 10);
  EXPECT_LT(same_d, 10);
  const auto small = freeze::tailor_positions({9}, 32, 7, 0);  // fewer weights than positions
  ASSERT_EQ(small.size(), 32u);
  for (auto& p : small) EXPECT_LT(p.offset, 9);
}

TEST(SmartFrz, APredictorFileRoundTripsAndAnotherShapeOrNoneIsNamed) {
  const auto g = small_geometry();
  Generator gen(1);
  freeze::SmartFrzPredictor p(g, gen);
  const auto meta = g.to_metadata();
  const auto back = freeze::SmartFrzGeometry::from_metadata(meta, "f");
  EXPECT_EQ(back.tailor, g.tailor);
  EXPECT_EQ(back.window, g.window);
  EXPECT_EQ(back.gain, g.gain);
  freeze::SmartFrzPredictor q(back, gen);
  q.load(p.state_dict(), "f");
  EXPECT_EQ(q.state_dict().at("head.4.weight").to_vector<float>(),
            p.state_dict().at("head.4.weight").to_vector<float>());

  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto bigger = g;
  bigger.hidden = 16;
  freeze::SmartFrzPredictor r(bigger, gen);
  const std::string shape = message([&] { r.load(p.state_dict(), "pred.safetensors"); });
  EXPECT_NE(shape.find("pred.safetensors does not fit"), std::string::npos) << shape;
  EXPECT_NE(shape.find("query.0.weight [12, 24] (expected [16, 24])"), std::string::npos) << shape;
  auto sd = p.state_dict();
  sd.erase("value.2.bias");
  sd["extra"] = Tensor::zeros({2});
  const std::string names = message([&] { q.load(sd, "f"); });
  EXPECT_NE(names.find("missing: value.2.bias"), std::string::npos) << names;
  EXPECT_NE(names.find("unexpected: extra"), std::string::npos) << names;
  EXPECT_NE(message([] { freeze::SmartFrzGeometry::from_metadata({}, "m.safetensors"); }).find("not a predictor file"),
            std::string::npos);
  auto bad = meta;
  bad["window"] = "three";
  EXPECT_NE(message([&] { freeze::SmartFrzGeometry::from_metadata(bad, "m"); }).find("'window' is 'three'"),
            std::string::npos);

  // A predictor of movement per unit of LR is format 2 and names its input; format 1 reads movement.
  EXPECT_EQ(meta.at("format"), freeze::kSmartFrzFormat);
  EXPECT_EQ(meta.count("input"), 0u);
  EXPECT_EQ(back.input, freeze::SmartFrzInput::movement);
  auto per_lr = g;
  per_lr.input = freeze::SmartFrzInput::movement_per_lr;
  auto meta2 = per_lr.to_metadata();
  EXPECT_EQ(meta2.at("format"), freeze::kSmartFrzFormat2);
  EXPECT_EQ(meta2.at("input"), "movement-per-lr");
  EXPECT_EQ(freeze::SmartFrzGeometry::from_metadata(meta2, "f").input, freeze::SmartFrzInput::movement_per_lr);
  meta2["input"] = "gradient";
  EXPECT_NE(message([&] {
              freeze::SmartFrzGeometry::from_metadata(meta2, "g.safetensors");
            }).find("g.safetensors: its input 'gradient' is not one of movement, movement-per-lr"),
            std::string::npos);
  meta2.erase("input");
  EXPECT_NE(message([&] { freeze::SmartFrzGeometry::from_metadata(meta2, "g"); }).find("has no 'input'"),
            std::string::npos);
}

// The loss of predicting the targets' frequencies whatever the input: their entropy, of
// the smoothed frequencies under label smoothing.
TEST(SmartFrz, TheConstantPredictionLossIsTheEntropyOfTheTargetFrequencies) {
  EXPECT_NEAR(freeze::constant_prediction_loss({5, 5, 5, 5}, 0), std::log(4.0), 1e-12);
  EXPECT_NEAR(freeze::constant_prediction_loss({3, 1}, 0), -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  EXPECT_NEAR(freeze::constant_prediction_loss({7, 0, 0}, 0), 0.0, 1e-12) << "one class: nothing to learn";
  // Smoothing 0.3 over 2 classes makes the targets (0.85, 0.15) and (0.15, 0.85); the best
  // constant prediction for the counts {1, 0} is (0.85, 0.15).
  EXPECT_NEAR(freeze::constant_prediction_loss({1, 0}, 0.3), -(0.85 * std::log(0.85) + 0.15 * std::log(0.15)), 1e-12);
  EXPECT_EQ(freeze::constant_prediction_loss({0, 0}, 0), 0.0) << "no targets: unknown";
  EXPECT_THROW(freeze::constant_prediction_loss({1, -1}, 0), Error);
  EXPECT_THROW(freeze::constant_prediction_loss({1, 1}, 1.0), Error);
}

// ---- the policy through the trainer

std::vector<json> jsonl(const std::string& p) {
  std::vector<json> v;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) v.push_back(json::parse(line));
  return v;
}

// The trainer tests' run, 4 epochs of 16 steps, every layer module a unit (11 on
// resnet20): a record every 2 steps into windows of 4, a stage at the end of each epoch.
train::TrainConfig smartfrz_run(const std::string& name) {
  train::TrainConfig c = testing::small_image_run(testing::fresh_dir("eg_smartfrz_" + name));
  c.freezing.policy = "smartfrz";
  c.freezing.units = train::FreezeUnits::layers;
  c.freezing.reference.synchronous = true;
  c.freezing.smartfrz.window = 4;
  c.freezing.smartfrz.record_every = 2;
  c.freezing.smartfrz.stage_every = 16;
  c.freezing.smartfrz.threshold = 0.5;  // the stand-in predictors below say 0.9 or 0.1
  c.freezing.smartfrz.patience = 1;  // a unit freezes at the first stage that names it
  c.freezing.smartfrz.start_below = 0;  // stages from the first (the wait has its own test)
  return c;
}

// A stand-in predictor: P(freeze) 0.9 for `names`, 0.1 for the others; it checks what it is given.
std::function<std::vector<double>(const std::vector<int64_t>&, const Tensor&)> naming(std::set<int64_t> names) {
  return [names](const std::vector<int64_t>& units, const Tensor& w) {
    EG_CHECK(w.dim() == 3 && w.size(0) == int64_t(units.size()) && w.size(1) == 4 && w.size(2) == 1024, "windows ",
             shape_str(w.shape()));
    const std::vector<float> v = w.to_vector<float>();
    double moved = 0;
    for (float x : v) {
      EG_CHECK(std::isfinite(x), "a feature is not finite");
      moved += std::abs(x);
    }
    EG_CHECK(moved > 0, "training weights did not move within their windows");
    std::vector<double> p;
    for (int64_t u : units) p.push_back(names.count(u) ? 0.9 : 0.1);
    return p;
  };
}

TEST(SmartFrzTrainer, AnyOrderFreezesTheNamedUnitsBehindTrainableOnesAndResumesBitIdentically) {
  auto cfg = [](const std::string& name) {
    train::TrainConfig c = smartfrz_run(name);
    c.freezing.smartfrz.order = freeze::SmartFrzOrder::any;
    c.freezing.smartfrz.max_per_stage = 0;
    c.freezing.smartfrz.predict = naming({1, 3});
    return c;
  };
  const train::TrainConfig a = cfg("any_full");
  auto s = train::run_training(a);
  ASSERT_TRUE(s.completed);
  // The stage at step 16 reads the 10 units but the head; its answer is acted on at step 17.
  auto log = jsonl(a.out + "/freeze.jsonl");
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log[0]["type"], "stage");
  EXPECT_EQ(log[0]["step"], 16);
  EXPECT_EQ(log[0]["units"], json::array({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(log[1]["type"], "freeze");
  EXPECT_EQ(log[1]["step"], 17);
  EXPECT_EQ(log[1]["froze"], json::array({1, 3}));
  EXPECT_EQ(log[1]["units"], json::array({1, 3}));
  // The later stages read only the units still training, and freeze nothing more.
  for (size_t i = 2; i < log.size(); ++i) {
    EXPECT_EQ(log[i]["type"], "stage") << log[i].dump();
    EXPECT_EQ(log[i]["units"], json::array({0, 2, 4, 5, 6, 7, 8, 9})) << log[i].dump();
  }
  EXPECT_EQ(log.size(), 2u + 2u) << "stages at steps 32 and 48 (64 is the last step: its answer is never acted on)";
  auto sum = json::parse(std::ifstream(a.out + "/summary.json"));
  EXPECT_EQ(sum["frozen_units_final"], json::array({1, 3}));
  EXPECT_EQ(sum["freeze_stats"]["stages"], 4);
  EXPECT_EQ(sum["freeze_stats"]["records"], 32);
  const std::string story = train::run_report(a.out);
  EXPECT_NE(story.find("froze layer1.0 (0.90), layer1.2 (0.90), P(freeze) at or over 0.50 at the stage of step 16"),
            std::string::npos)
      << story;
  EXPECT_NE(story.find("its recording and predictor cost"), std::string::npos) << story;

  // Killed before the first stage, and again between the stage and the step that acts on it.
  const train::TrainConfig b = cfg("any_killed");
  ASSERT_TRUE(testing::run_killed_twice(b, 10, 6));
  testing::expect_same_weights(a.out, b.out);
  EXPECT_EQ(jsonl(b.out + "/freeze.jsonl").size(), log.size());
}

TEST(SmartFrzTrainer, PrefixOrderStopsAtTheFirstUnitThePredictorKeeps) {
  train::TrainConfig c = smartfrz_run("prefix");
  c.freezing.smartfrz.max_per_stage = 0;
  c.freezing.smartfrz.predict = naming({0, 1, 3});
  ASSERT_TRUE(train::run_training(c).completed);
  auto sum = json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(sum["frozen_units_final"], json::array({0, 1})) << "unit 2 is kept, so unit 3 waits behind it";
  EXPECT_EQ(sum["freeze_stats"]["order"], "prefix");
  train::TrainConfig none = smartfrz_run("prefix_none");
  none.freezing.smartfrz.predict = naming({1, 3});
  ASSERT_TRUE(train::run_training(none).completed);
  EXPECT_EQ(json::parse(std::ifstream(none.out + "/summary.json"))["frozen_units_final"], json::array());
}

// --smartfrz-max-per-stage 1: a stage freezes the front one of the units it may, in
// either order; the next stage takes the next.
TEST(SmartFrzTrainer, AStageFreezesAtMostMaxPerStageUnitsFrontFirst) {
  auto froze = [](const std::string& name, freeze::SmartFrzOrder order, std::set<int64_t> names) {
    train::TrainConfig c = smartfrz_run(name);
    c.freezing.smartfrz.order = order;
    c.freezing.smartfrz.max_per_stage = 1;
    c.freezing.smartfrz.predict = naming(std::move(names));
    EXPECT_TRUE(train::run_training(c).completed);
    std::vector<std::pair<int64_t, json>> v;
    for (const json& r : jsonl(c.out + "/freeze.jsonl"))
      if (r["type"] == "freeze") v.emplace_back(r["step"].get<int64_t>(), r["froze"]);
    EXPECT_EQ(json::parse(std::ifstream(c.out + "/summary.json"))["freeze_stats"]["max_per_stage"], 1);
    return v;
  };
  using V = std::vector<std::pair<int64_t, json>>;
  EXPECT_EQ(froze("max1_prefix", freeze::SmartFrzOrder::prefix, {0, 1, 3}),
            (V{{17, json::array({0})}, {33, json::array({1})}}))
      << "unit 2 is kept, so the stage of step 48 freezes nothing";
  EXPECT_EQ(froze("max1_any", freeze::SmartFrzOrder::any, {1, 3, 4}),
            (V{{17, json::array({1})}, {33, json::array({3})}, {49, json::array({4})}}));
}

// --smartfrz-patience 2: a unit freezes at the second stage in a row that names it; one
// stage that keeps it starts its count again. The streaks survive a resume.
TEST(SmartFrzTrainer, PatienceFreezesAUnitNamedAtThatManyStagesInARow) {
  auto freezes = [](const train::TrainConfig& c) {
    std::vector<std::pair<int64_t, json>> v;
    for (const json& r : jsonl(c.out + "/freeze.jsonl"))
      if (r["type"] == "freeze") v.emplace_back(r["step"].get<int64_t>(), r["froze"]);
    return v;
  };
  using V = std::vector<std::pair<int64_t, json>>;
  // The stages of steps 16, 32, 48 name {1, 3}, {3, 4}, {1, 4}: unit 1's streak breaks at 32.
  train::TrainConfig c = smartfrz_run("patience_varying");
  c.freezing.smartfrz.order = freeze::SmartFrzOrder::any;
  c.freezing.smartfrz.max_per_stage = 0;
  c.freezing.smartfrz.patience = 2;
  const std::vector<std::set<int64_t>> by_stage = {{1, 3}, {3, 4}, {1, 4}, {}};
  auto stage = std::make_shared<size_t>(0);
  c.freezing.smartfrz.predict = [by_stage, stage](const std::vector<int64_t>& units, const Tensor& w) {
    return naming(by_stage.at(std::min((*stage)++, by_stage.size() - 1)))(units, w);
  };
  ASSERT_TRUE(train::run_training(c).completed);
  EXPECT_EQ(freezes(c), (V{{33, json::array({3})}, {49, json::array({4})}}));
  auto sum = json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(sum["frozen_units_final"], json::array({3, 4}));
  EXPECT_EQ(sum["freeze_stats"]["patience"], 2);

  // Prefix order, the same names at every stage: the front one waits a stage, then one a stage.
  auto cfg = [](const std::string& name) {
    train::TrainConfig p = smartfrz_run(name);
    p.freezing.smartfrz.patience = 2;
    p.freezing.smartfrz.predict = naming({0, 1});
    return p;
  };
  const train::TrainConfig a = cfg("patience_full");
  ASSERT_TRUE(train::run_training(a).completed);
  EXPECT_EQ(freezes(a), (V{{33, json::array({0})}, {49, json::array({1})}}));
  const std::string story = train::run_report(a.out);
  EXPECT_NE(story.find("froze stem (0.90, named at 2 stages in a row)"), std::string::npos) << story;
  EXPECT_NE(story.find("froze layer1.0 (0.90, named at 3 stages in a row)"), std::string::npos) << story;
  // Killed after the first stage (a streak of one is in the checkpoint) and between the
  // second stage and the step that acts on it.
  const train::TrainConfig b = cfg("patience_killed");
  ASSERT_TRUE(testing::run_killed_twice(b, 20, 12));
  testing::expect_same_weights(a.out, b.out);
  EXPECT_EQ(freezes(b), freezes(a));
}

// Note [SmartFRZ waits for learning]: no stage runs until the mean training loss since the
// last stage is at most --smartfrz-start-below times the loss of predicting the training
// labels' frequencies; the held stages are logged with that mean, and the wait resumes.
TEST(SmartFrzTrainer, StagesWaitUntilTheTrainingLossFallsBelowTheConstantPredictionsShare) {
  auto cfg = [](const std::string& name, double start_below) {
    train::TrainConfig c = smartfrz_run(name);
    c.freezing.smartfrz.start_below = start_below;
    c.freezing.smartfrz.predict = naming({0, 1, 2});
    return c;
  };
  auto lines = [](const train::TrainConfig& c, const std::string& type) {
    std::vector<json> v;
    for (json& r : jsonl(c.out + "/freeze.jsonl"))
      if (r["type"] == type) v.push_back(r);
    return v;
  };
  // Held at every stage: the four stages' means, and nothing frozen.
  const train::TrainConfig never = cfg("wait_never", 1e-6);
  ASSERT_TRUE(train::run_training(never).completed);
  const auto held = lines(never, "held");
  ASSERT_EQ(held.size(), 4u);
  EXPECT_TRUE(lines(never, "stage").empty());
  EXPECT_TRUE(lines(never, "freeze").empty());
  const auto sum = json::parse(std::ifstream(never.out + "/summary.json"));
  EXPECT_EQ(sum["frozen_units_final"], json::array());
  EXPECT_EQ(sum["freeze_stats"]["stages"], 0) << "a held stage runs no predictor";
  EXPECT_NE(train::run_report(never.out).find("held every freezing stage (4)"), std::string::npos)
      << train::run_report(never.out);
  const double constant = sum["freeze_stats"]["constant_loss"].get<double>();
  EXPECT_GT(constant, 0.5 * std::log(10.0)) << "the synthetic labels' frequencies: about uniform over 10 classes";
  EXPECT_LE(constant, std::log(10.0) + 1e-12);
  std::vector<double> mean;
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(held[i]["step"], 16 * int64_t(i + 1));
    EXPECT_DOUBLE_EQ(held[i]["constant_loss"].get<double>(), constant);
    mean.push_back(held[i]["train_loss"].get<double>());
  }
  // A bound between the first stage's mean and a later, lower one: held, then started at
  // the first stage at or under it, and from there the stages run and freeze as without a wait.
  const size_t first_under = mean[2] < mean[1] ? 2 : 1;  // a start at 64 would act on nothing
  ASSERT_LT(mean[first_under], mean[0]) << "the small run's loss does not fall";
  const double bound = mean[first_under];
  size_t start = 1;
  while (mean[start] > bound) ++start;
  const train::TrainConfig a = cfg("wait_then_start", bound / constant * (1 + 1e-12));
  ASSERT_TRUE(train::run_training(a).completed);
  const auto held_a = lines(a, "held"), started = lines(a, "start"), stages = lines(a, "stage");
  ASSERT_EQ(held_a.size(), start);
  for (size_t i = 0; i < start; ++i) EXPECT_DOUBLE_EQ(held_a[i]["train_loss"].get<double>(), mean[i]) << i;
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0]["step"], 16 * int64_t(start + 1));
  EXPECT_DOUBLE_EQ(started[0]["train_loss"].get<double>(), mean[start]);
  ASSERT_EQ(stages.size(), 3 - start) << "a stage is logged when acted on: the one of step 64 never is";
  EXPECT_EQ(stages[0]["step"], started[0]["step"]);
  const auto froze = lines(a, "freeze");
  ASSERT_FALSE(froze.empty());
  EXPECT_EQ(froze[0]["step"], 16 * int64_t(start + 1) + 1);
  const std::string story = train::run_report(a.out);
  EXPECT_NE(story.find("held its first " + std::to_string(start) + " freezing stages until step " +
                       std::to_string(16 * (start + 1))),
            std::string::npos)
      << story;
  // Learning begun by the first stage: nothing held, and the report says so.
  const train::TrainConfig at_once = cfg("wait_none", 1e6);
  ASSERT_TRUE(train::run_training(at_once).completed);
  EXPECT_EQ(lines(at_once, "held").size(), 0u);
  EXPECT_NE(train::run_report(at_once.out).find("its first freezing stage (step 16) found the mean training loss at"),
            std::string::npos)
      << train::run_report(at_once.out);

  // Killed halfway through the stage that starts (half its losses in the checkpoint) and
  // again between that stage and the step that acts on it: the same weights and log.
  const train::TrainConfig b = cfg("wait_killed", bound / constant * (1 + 1e-12));
  ASSERT_TRUE(testing::run_killed_twice(b, 16 * int64_t(start) + 8, 8));
  testing::expect_same_weights(a.out, b.out);
  EXPECT_EQ(jsonl(b.out + "/freeze.jsonl"), jsonl(a.out + "/freeze.jsonl"));
}

// A predictor from a file, on the background thread and inline: the same probabilities.
TEST(SmartFrzTrainer, APredictorFileDecidesTheSameInTheBackgroundAsInline) {
  auto g = small_geometry();
  g.window = 4;
  Generator gen(11);
  freeze::SmartFrzPredictor p(g, gen);
  const std::string file = testing::fresh_dir("eg_smartfrz_pred") + "/pred.safetensors";
  train::save_safetensors(file, p.state_dict(), g.to_metadata());
  auto run = [&](const std::string& name, bool sync) {
    train::TrainConfig c = smartfrz_run(name);
    c.freezing.smartfrz.window = 0;  // the predictor's: 4
    c.freezing.smartfrz.predictor = file;
    c.freezing.reference.synchronous = sync;
    EXPECT_TRUE(train::run_training(c).completed);
    std::vector<json> stages;
    for (auto& j : jsonl(c.out + "/freeze.jsonl"))
      if (j["type"] == "stage") stages.push_back(j);
    return stages;
  };
  const auto inline_ = run("file_inline", true), background = run("file_background", false);
  ASSERT_FALSE(inline_.empty());
  for (auto& s : inline_)
    for (auto& v : s["p_freeze"]) EXPECT_TRUE(v.get<double>() >= 0 && v.get<double>() <= 1) << s.dump();
  EXPECT_EQ(inline_, background);
}

// A predictor of movement per unit of LR gets each record's LR, the mean of the steps'
// since the record before (some spanning the decay of step 33), through a kill between
// records and another between a stage and the step that acts on it.
TEST(SmartFrzTrainer, APerLrPredictorReadsTheRecordsLrsAndResumesBitIdentically) {
  auto g = small_geometry();
  g.window = 4;
  Generator gen(12);
  freeze::SmartFrzPredictor p(g, gen);
  const std::string dir = testing::fresh_dir("eg_smartfrz_perlr");
  train::save_safetensors(dir + "/movement.safetensors", p.state_dict(), g.to_metadata());
  g.input = freeze::SmartFrzInput::movement_per_lr;
  train::save_safetensors(dir + "/per-lr.safetensors", p.state_dict(), g.to_metadata());
  auto cfg = [&](const std::string& name, const std::string& file) {
    train::TrainConfig c = smartfrz_run(name);
    c.milestones = {2};  // LR / 10 from step 33
    c.freezing.smartfrz.window = 0;
    c.freezing.smartfrz.record_every = 3;
    c.freezing.smartfrz.stage_every = 20;
    c.freezing.smartfrz.threshold = 0.999999;  // read, never freeze: the stages compare
    c.freezing.smartfrz.predictor = dir + "/" + file;
    return c;
  };
  auto stages = [](const train::TrainConfig& c) {
    std::vector<json> s;
    for (auto& j : jsonl(c.out + "/freeze.jsonl"))
      if (j["type"] == "stage") s.push_back(j);
    return s;
  };
  const train::TrainConfig a = cfg("perlr_full", "per-lr.safetensors"),
                           m = cfg("perlr_movement", "movement.safetensors");
  ASSERT_TRUE(train::run_training(a).completed);
  ASSERT_TRUE(train::run_training(m).completed);
  const auto sa = stages(a), sm = stages(m);
  ASSERT_EQ(sa.size(), 3u) << "stages at steps 20, 40 and 60";
  ASSERT_EQ(sm.size(), 3u);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_NE(sa[i]["p_freeze"], sm[i]["p_freeze"]) << "the same input read";
  const auto sum = json::parse(std::ifstream(a.out + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["input"], "movement-per-lr");
  const train::TrainConfig b = cfg("perlr_killed", "per-lr.safetensors");
  ASSERT_TRUE(testing::run_killed_twice(b, 31, 9));  // step 31 between records; 40 a stage
  testing::expect_same_weights(a.out, b.out);
  EXPECT_EQ(stages(b), sa);

  // A checkpoint whose windows carry no LRs (an older egeria's) cannot go on under it.
  train::TrainConfig o = cfg("perlr_old", "per-lr.safetensors");
  o.checkpoint_every = 1;
  o.stop_after_steps = 31;
  EXPECT_FALSE(train::run_training(o).completed);
  train::Metadata meta;
  auto ck = train::load_safetensors(o.out + "/checkpoint.safetensors", &meta);
  size_t dropped = 0;
  for (auto it = ck.begin(); it != ck.end();)
    it = it->first.find("smartfrz/window_lr/") != std::string::npos ? (++dropped, ck.erase(it)) : std::next(it);
  ASSERT_GT(dropped, 0u);
  train::save_safetensors(o.out + "/checkpoint.safetensors", ck, meta);
  o.resume = true;
  o.stop_after_steps = 0;
  try {
    train::run_training(o);
    ADD_FAILURE() << "resumed without the windows' LRs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the checkpoint's windows carry no learning rates"), std::string::npos)
        << e.what();
  }
}

// share/smartfrz-predictor.safetensors (bench/train_smartfrz_predictor.py) is what
// --freeze smartfrz takes without --smartfrz-predictor.
TEST(SmartFrzTrainer, TheShippedPredictorIsFoundFitsItsShapeAndIsTheDefault) {
  const std::string f = train::shipped_smartfrz_predictor();
  ASSERT_FALSE(f.empty()) << "no share/smartfrz-predictor.safetensors: bench/train_smartfrz_predictor.py makes it";
  EXPECT_LE(std::filesystem::file_size(f), 5u << 20) << "a few MB at most";
  train::Metadata meta;
  const auto w = train::load_safetensors(f, &meta);
  const auto g = freeze::SmartFrzGeometry::from_metadata(meta, f);
  freeze::SmartFrzPredictor p(g);
  p.load(w, f);
  train::TrainConfig c = smartfrz_run("shipped");
  c.freezing.smartfrz.window = 0;  // the predictor's
  c.freezing.smartfrz.record_every = 1;
  ASSERT_TRUE(train::run_training(c).completed);
  const auto sum = json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["predictor"], f);
  EXPECT_EQ(sum["freeze_stats"]["window"], g.window);
  EXPECT_GE(sum["freeze_stats"]["stages"].get<int64_t>(), 1);
}

TEST(SmartFrzTrainer, BadPredictorsWindowsAndIntervalsAreNamedBeforeTraining) {
  const std::string dir = testing::fresh_dir("eg_smartfrz_badfiles");
  auto g = small_geometry();
  Generator gen(2);
  freeze::SmartFrzPredictor p(g, gen);
  auto sd = p.state_dict();
  auto meta = g.to_metadata();
  meta["hidden"] = "16";
  train::save_safetensors(dir + "/other-shape.safetensors", sd, meta);
  train::save_safetensors(dir + "/no-meta.safetensors", sd);
  {
    std::ofstream f(dir + "/corrupt.safetensors", std::ios::binary);
    f << "this is not a safetensors file";
  }
  auto refused = [](std::function<void(train::TrainConfig&)> set, const std::string& want) {
    train::TrainConfig c = smartfrz_run("bad");
    set(c);
    try {
      train::run_training(c);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_FALSE(std::filesystem::exists(c.out + "/metrics.jsonl")) << "it trained first: " << want;
      return;
    }
    ADD_FAILURE() << "not refused: " << want;
  };
  if (train::shipped_smartfrz_predictor().empty())
    refused([](train::TrainConfig&) {}, "--freeze smartfrz needs a trained predictor: none is installed");
  refused([&](train::TrainConfig& c) { c.freezing.smartfrz.predictor = dir + "/missing.safetensors"; },
          dir + "/missing.safetensors");
  refused([&](train::TrainConfig& c) { c.freezing.smartfrz.predictor = dir + "/corrupt.safetensors"; },
          dir + "/corrupt.safetensors");
  refused([&](train::TrainConfig& c) { c.freezing.smartfrz.predictor = dir + "/no-meta.safetensors"; },
          "no-meta.safetensors: not a predictor file");
  refused([&](train::TrainConfig& c) { c.freezing.smartfrz.predictor = dir + "/other-shape.safetensors"; },
          "query.0.weight [12, 24] (expected [16, 24])");
  refused(
      [](train::TrainConfig& c) {
    c.freezing.smartfrz.predict = naming({});
    c.freezing.smartfrz.window = 40;
      },
      "a window of 40 records, one every 2 steps, takes 80 steps to fill, and the run has only 64");
  refused(
      [](train::TrainConfig& c) {
    c.freezing.smartfrz.predict = naming({});
    c.freezing.smartfrz.stage_every = 65;
      },
      "--smartfrz-stage-every 65 is longer than the run (64 steps)");
}

}  // namespace
}  // namespace eg

namespace eg {
namespace {

// ---- the predictor's training data and its training (train/smartfrz_record.h, smartfrz_train.h)

TEST(SmartFrzLabels, LinearCkaOfGramsIsKornbliths) {
  Generator g(4);
  const int64_t n = 6, d = 5;
  const std::vector<float> x = Tensor::randn({n, d}, g).to_vector<float>(),
                           y = Tensor::randn({n, d}, g).to_vector<float>();
  auto gram = [&](const std::vector<float>& a) {
    std::vector<float> k(size_t(n * n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < d; ++c) k[size_t(i * n + j)] += a[size_t(i * d + c)] * a[size_t(j * d + c)];
    return k;
  };
  // From centred features: |Yc^T Xc|_F^2 / (|Xc^T Xc|_F |Yc^T Yc|_F).
  auto centre = [&](std::vector<float> a) {
    for (int64_t c = 0; c < d; ++c) {
      double m = 0;
      for (int64_t i = 0; i < n; ++i) m += a[size_t(i * d + c)];
      for (int64_t i = 0; i < n; ++i) a[size_t(i * d + c)] -= float(m / double(n));
    }
    return a;
  };
  auto cross = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (int64_t p = 0; p < d; ++p)
      for (int64_t q = 0; q < d; ++q) {
        double v = 0;
        for (int64_t i = 0; i < n; ++i) v += double(a[size_t(i * d + p)]) * b[size_t(i * d + q)];
        s += v * v;
      }
    return s;
  };
  const auto xc = centre(x), yc = centre(y);
  const double want = cross(yc, xc) / std::sqrt(cross(xc, xc) * cross(yc, yc));
  EXPECT_NEAR(train::linear_cka(gram(x), gram(y), n), want, 1e-5);
  EXPECT_NEAR(train::linear_cka(gram(x), gram(x), n), 1.0, 1e-9);
  std::vector<float> x3 = x;
  for (float& v : x3) v *= 3;
  EXPECT_NEAR(train::linear_cka(gram(x3), gram(y), n), want, 1e-5) << "invariant to scale";
}

train::TrainConfig recording_run(const std::string& name) {
  train::TrainConfig c = testing::small_image_run(testing::fresh_dir("eg_smartfrz_rec_" + name));
  c.train_limit = 128;  // 8 steps an epoch, 32 in all: a record each
  c.freezing.smartfrz.record = true;
  c.freezing.smartfrz.record_every = 1;
  c.freezing.smartfrz.probe = 8;
  return c;
}

TEST(SmartFrzRecords, ARunRecordsWeightsAndGramsAndAResumedRunTheSame) {
  const train::TrainConfig a = recording_run("full");
  ASSERT_TRUE(train::run_training(a).completed);
  train::Metadata meta;
  const auto t = train::load_safetensors(a.out + "/smartfrz-records.safetensors", &meta);
  EXPECT_EQ(meta.at("format"), train::kSmartFrzRecordsFormat);
  EXPECT_EQ(meta.at("model"), "resnet20");
  EXPECT_EQ(meta.at("probe"), "8");
  const auto units = json::parse(meta.at("units"));
  ASSERT_EQ(units.size(), 5u) << "resnet20's automatic units but the head";
  const std::vector<int64_t> steps = t.at("steps").to_vector<int64_t>();
  ASSERT_EQ(steps.size(), 32u);
  EXPECT_EQ(steps.front(), 1);
  EXPECT_EQ(steps.back(), 32);
  const std::vector<float> lrs = t.at("lrs").to_vector<float>();  // a record a step: each step's LR
  ASSERT_EQ(lrs.size(), 32u);
  for (size_t i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(lrs[i], steps[i] <= 24 ? 0.05f : 0.005f) << "step " << steps[i];
  for (size_t u = 0; u < units.size(); ++u) {
    const Tensor& w = t.at("weights/" + std::to_string(u));
    const Tensor& g = t.at("grams/" + std::to_string(u));
    EXPECT_EQ(w.shape(), (Shape{32, 1024}));
    EXPECT_EQ(g.shape(), (Shape{32, 8, 8}));
    const std::vector<float> wv = w.to_vector<float>(), gv = g.to_vector<float>();
    EXPECT_NE(std::vector<float>(wv.begin(), wv.begin() + 1024), std::vector<float>(wv.end() - 1024, wv.end()))
        << "unit " << u << "'s weights did not move";
    for (int i = 0; i < 8; ++i) EXPECT_GE(gv[size_t(i * 8 + i)], 0.0f);
    EXPECT_NEAR(gv[1], gv[8], 1e-3 * std::max(1.0f, std::abs(gv[1]))) << "a Gram is symmetric";
  }
  const train::TrainConfig b = recording_run("killed");
  ASSERT_TRUE(testing::run_killed_twice(b, 9, 20));
  const auto tb = train::load_safetensors(b.out + "/smartfrz-records.safetensors");
  ASSERT_EQ(tb.size(), t.size());
  for (auto& [k, v] : t) {
    if (v.dtype() == DType::s64) EXPECT_EQ(v.to_vector<int64_t>(), tb.at(k).to_vector<int64_t>()) << k;
    else EXPECT_EQ(v.to_vector<float>(), tb.at(k).to_vector<float>()) << k;
  }
}

TEST(SmartFrzTraining, LabelsByCkaTrainAPredictorThatTheSmartFrzPolicyTakes) {
  const train::TrainConfig a = recording_run("train_a");
  train::TrainConfig b = recording_run("train_b");
  b.seed = 6;
  b.model = "resnet32";
  ASSERT_TRUE(train::run_training(a).completed);
  ASSERT_TRUE(train::run_training(b).completed);
  train::SmartFrzTrainOptions o;
  o.records = {a.out + "/smartfrz-records.safetensors", b.out + "/smartfrz-records.safetensors"};
  o.window = 6;
  o.epochs = 2;
  o.geometry.hidden = 16;
  o.geometry.dim = 8;
  o.geometry.head = 8;
  o.hold_out = "resnet32";
  o.out = testing::fresh_dir("eg_smartfrz_predictor_out") + "/pred.safetensors";
  const json r = train::train_smartfrz_predictor(o);
  EXPECT_EQ(r["input"], "movement");
  ASSERT_EQ(r["runs"].size(), 2u);
  for (auto& run : r["runs"])
    for (auto& u : run["units"]) {
      const int64_t from = u["freeze_from_record"];
      EXPECT_LT(from, 32) << "the last record is the run's end: CKA 1";
      EXPECT_NEAR(u["cka"].back().get<double>(), 1.0, 1e-6);
      for (size_t i = size_t(from); i < u["cka"].size(); ++i) EXPECT_GE(u["cka"][i].get<double>(), 1 - 0.02);
      if (from > 0) {
        EXPECT_LT(u["cka"][size_t(from - 1)].get<double>(), 1 - 0.02);
      }
    }
  EXPECT_TRUE(r["runs"][1]["held_out"].get<bool>());
  EXPECT_EQ(r["held_out"]["model"], "resnet32");
  const json& s = r["held_out"]["scores"];
  EXPECT_EQ(s["samples"].get<int64_t>(), int64_t(r["runs"][1]["units"].size()) * (32 - 6 + 1));
  EXPECT_EQ(s["true_positives"].get<int64_t>() + s["false_negatives"].get<int64_t>(), s["positives"].get<int64_t>());
  EXPECT_GT(r["gain"].get<double>(), 0.0);

  // The policy takes the file as it is.
  train::TrainConfig c = smartfrz_run("trained");
  c.freezing.smartfrz.window = 0;
  c.freezing.smartfrz.predictor = o.out;
  ASSERT_TRUE(train::run_training(c).completed);
  auto sum = json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["window"], 6);
  EXPECT_GE(sum["freeze_stats"]["stages"].get<int64_t>(), 1);

  auto message = [](const train::SmartFrzTrainOptions& o) {
    try {
      train::train_smartfrz_predictor(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  train::SmartFrzTrainOptions bad = o;
  bad.out.clear();
  bad.records = {o.out};  // a predictor, not records
  EXPECT_NE(message(bad).find("is not a records file of --smartfrz-record on"), std::string::npos) << message(bad);
  bad = o;
  bad.out.clear();
  bad.hold_out = "vgg11";
  EXPECT_NE(message(bad).find("no run of model 'vgg11' to hold out"), std::string::npos) << message(bad);
  bad.hold_out.clear();
  bad.window = 40;
  EXPECT_NE(message(bad).find("fewer than a window (40)"), std::string::npos) << message(bad);

  // movement-per-lr: format 2, and the policy reads it so; records without LRs refused.
  train::SmartFrzTrainOptions per_lr = o;
  per_lr.geometry.input = freeze::SmartFrzInput::movement_per_lr;
  per_lr.hold_out.clear();
  per_lr.out = testing::fresh_dir("eg_smartfrz_predictor_perlr") + "/pred.safetensors";
  const json r2 = train::train_smartfrz_predictor(per_lr);
  EXPECT_EQ(r2["input"], "movement-per-lr");
  EXPECT_NE(r2["gain"], r["gain"]);
  train::Metadata pm;
  train::load_safetensors(per_lr.out, &pm);
  EXPECT_EQ(pm.at("format"), freeze::kSmartFrzFormat2);
  train::TrainConfig d = smartfrz_run("trained_perlr");
  d.freezing.smartfrz.window = 0;
  d.freezing.smartfrz.predictor = per_lr.out;
  ASSERT_TRUE(train::run_training(d).completed);
  EXPECT_EQ(json::parse(std::ifstream(d.out + "/summary.json"))["freeze_stats"]["input"], "movement-per-lr");
  train::Metadata rm;
  auto old = train::load_safetensors(a.out + "/smartfrz-records.safetensors", &rm);
  old.erase("lrs");
  const std::string old_file = testing::fresh_dir("eg_smartfrz_old_records") + "/smartfrz-records.safetensors";
  train::save_safetensors(old_file, old, rm);
  bad = per_lr;
  bad.out.clear();
  bad.records = {old_file};
  EXPECT_NE(message(bad).find("holds no learning rates (recorded by an egeria before they were)"), std::string::npos)
      << message(bad);
  bad.geometry.input = freeze::SmartFrzInput::movement;
  EXPECT_NO_THROW(train::train_smartfrz_predictor(bad)) << "movement reads such a file";
}

}  // namespace
}  // namespace eg
