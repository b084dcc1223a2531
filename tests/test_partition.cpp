// Freezing units (freeze/partition.h): the paper's partitioning of stages, one unit per
// layer module, and units by parameter-name regex.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "freeze/partition.h"
#include "freeze/policy.h"

using namespace eg;

namespace {

models::ModelPtr model(const std::string& name, int64_t image = 32) {
  models::ModelConfig mc;
  mc.name = name;
  mc.image_size = image;
  Generator g(1);
  return models::build_model(mc, g);
}

// Units are contiguous, cover every layer module once, and count every parameter.
void expect_well_formed(const models::Model& m, const freeze::Partition& p) {
  const auto layers = m.layer_modules();
  int64_t at = 0, params = 0;
  for (auto& u : p.units()) {
    EXPECT_EQ(u.begin, at) << u.name;
    EXPECT_GT(u.end, u.begin) << u.name;
    at = u.end;
    params += u.params;
  }
  EXPECT_EQ(at, int64_t(layers.size()));
  EXPECT_EQ(params, m.num_parameters());
  EXPECT_EQ(p.units().back().name, "head");
  EXPECT_EQ(p.units().back().end - p.units().back().begin, 1) << "the head is a unit of its own";
}

// Egeria on `m` (resnet20 at 16 px), a 100-step run, its reference read synchronously.
freeze::PolicyConfig egeria_config(const models::Model& m) {
  freeze::PolicyConfig c;
  c.policy = "egeria";
  c.model.name = "resnet20";
  c.model.image_size = 16;
  c.partition = freeze::make_partition(m, freeze::PartitionMode::automatic);
  c.total_steps = 100;
  c.reference.synchronous = true;
  return c;
}

TEST(Partition, AutoSplitsResNet56AsThePaperDoes) {
  // Fig. 11: layer1 (5% of the parameters) and layer2 (20%) are evaluated whole, layer3
  // (75%) is split into similar-sized units, and its last unit once more: 7 units and
  // the head.
  auto m = model("resnet56");
  auto p = freeze::make_partition(*m, freeze::PartitionMode::automatic);
  expect_well_formed(*m, p);
  auto n = p.names();
  ASSERT_EQ(p.size(), 8) << nlohmann::json(n).dump();
  EXPECT_EQ(n[0], "stem+layer1");
  EXPECT_EQ(n[1], "layer2");
  for (int i = 2; i < 7; ++i) EXPECT_EQ(n[size_t(i)].rfind("layer3.", 0), 0u) << n[size_t(i)];
  // Layer3's units before the last split are as even as whole blocks allow: none holds
  // more than ceil(9 / 4) = 3 blocks' worth of parameters.
  const int64_t block = m->layer_modules()[20].second->num_parameters();
  for (int i = 2; i < 5; ++i) EXPECT_LE(p.units()[size_t(i)].params, 3 * block) << p.to_json().dump();
  // The frozen prefix of k units is the layer modules those units hold.
  EXPECT_EQ(p.layer_prefix(0), 0);
  EXPECT_EQ(p.layer_prefix(1), 10);  // stem + 9 blocks
  EXPECT_EQ(p.layer_prefix(2), 19);
  EXPECT_EQ(p.last_layer(1), 18);
  EXPECT_EQ(p.units()[6].end - p.units()[6].begin, 1) << "the last body unit is split once more";
}

TEST(Partition, AutoOnResNet20AndMobileNetV2) {
  auto r = model("resnet20");
  auto pr = freeze::make_partition(*r, freeze::PartitionMode::automatic);
  expect_well_formed(*r, pr);
  EXPECT_EQ(pr.names()[0], "stem+layer1");
  EXPECT_GE(pr.size(), 5);
  // MobileNetV2's layer modules carry no stage names: about equal shares, 6 and the head.
  auto mb = model("mobilenetv2");
  auto pm = freeze::make_partition(*mb, freeze::PartitionMode::automatic);
  expect_well_formed(*mb, pm);
  EXPECT_EQ(pm.size(), 7) << nlohmann::json(pm.names()).dump();
  int64_t body = 0;
  for (int64_t i = 0; i + 1 < pm.size(); ++i) body += pm.units()[size_t(i)].params;
  // No unit is more than twice its fair share, unless it is a single layer module.
  for (int64_t i = 0; i + 1 < pm.size(); ++i) {
    const auto& u = pm.units()[size_t(i)];
    if (u.end - u.begin > 1) {
      EXPECT_LT(double(u.params), 2.0 * double(body) / 6.0) << u.name;
    }
  }
}

TEST(Partition, LayersModeIsOneUnitPerLayerModule) {
  auto m = model("resnet20");
  auto p = freeze::make_partition(*m, freeze::PartitionMode::layers);
  expect_well_formed(*m, p);
  ASSERT_EQ(p.size(), int64_t(m->layer_modules().size()));
  for (int64_t i = 0; i < p.size(); ++i) EXPECT_EQ(p.names()[size_t(i)], m->layer_modules()[size_t(i)].first);
}

TEST(Partition, RegexGroupsParametersByTheirMatch) {
  auto m = model("resnet20");
  auto p = freeze::make_partition(*m, freeze::PartitionMode::automatic, "^(layer[0-9]+)\\.");
  expect_well_formed(*m, p);
  EXPECT_EQ(p.names(), (std::vector<std::string>{"stem", "layer1", "layer2", "layer3", "head"}));
  // Without a group the whole match is the key: one unit per block of layer2.
  auto q = freeze::make_partition(*m, freeze::PartitionMode::automatic, "^layer2\\.[0-9]+");
  EXPECT_EQ(q.size(), 1 + 3 + 3 + 3 + 1);
}

TEST(Partition, RegexErrorsNameTheProblem) {
  auto m = model("resnet20");
  auto msg = [&](const std::string& re) {
    try {
      freeze::make_partition(*m, freeze::PartitionMode::automatic, re);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("(layer").find("not a valid regular expression"), std::string::npos) << msg("(layer");
  EXPECT_NE(msg("(conv[12])").find("into two units"), std::string::npos) << msg("(conv[12])");
  EXPECT_NE(msg("^(?:layer1|layer3)\\.[0-9]\\.(conv)").find("not contiguous"), std::string::npos);
  EXPECT_NE(msg("nothing-matches-this").find("matches none"), std::string::npos);
  EXPECT_NE(msg("^").find("single unit"), std::string::npos) << msg("^");
}

TEST(Partition, PoliciesCountInUnits) {
  auto m = model("resnet20", 16);
  freeze::PolicyConfig c;
  c.policy = "static";
  c.partition = freeze::make_partition(*m, freeze::PartitionMode::automatic);
  c.static_modules = 2;
  c.static_epoch = 0;
  auto pol = freeze::make_policy(c, int64_t(m->layer_modules().size()));
  pol->after_step({1, 0, 0.1, 2.0, Tensor(), Tensor()}, Tensor(), Tensor(), *m);
  EXPECT_EQ(pol->frozen_units(), freeze::first_units(2));
  EXPECT_EQ(c.partition.layer_prefix(2), c.partition.units()[1].end);
  // A partition that does not cover the model is refused.
  freeze::PolicyConfig bad = c;
  bad.partition = freeze::make_partition(*model("resnet32", 16), freeze::PartitionMode::automatic);
  EXPECT_THROW(freeze::make_policy(bad, int64_t(m->layer_modules().size())), Error);
}

// A step whose every sample was left out (--skip-bad-images) has no loss and zero
// gradients: Egeria's bootstrapping mean leaves it out (a span of only such steps makes no
// check), and AutoFreeze's reading waits for the next step that trained.
TEST(Partition, PoliciesTakeNoReadingFromAStepThatTrainedNothing) {
  auto m = model("resnet20", 16);
  freeze::PolicyConfig c = egeria_config(*m);
  c.tracker.interval = 1;
  c.tracker.bootstrap_interval = 2;
  const int64_t layers = int64_t(m->layer_modules().size());
  auto egeria = freeze::make_policy(c, layers);
  const std::vector<std::pair<double, bool>> steps = {{2.0, true},  {2.0, true},  {1.0, true}, {0.0, false},
                                                      {0.0, false}, {0.0, false}, {0.5, true}, {0.5, true}};
  for (size_t i = 0; i < steps.size(); ++i) {
    freeze::StepInfo s;
    s.step = int64_t(i) + 1;
    s.lr = 0.1;
    s.loss = steps[i].first;
    s.trained = steps[i].second;
    egeria->after_step(s, Tensor(), Tensor(), *m);
  }
  std::vector<std::pair<int64_t, double>> checks;
  for (auto& e : egeria->take_log())
    if (e.at("type") == "bootstrap") checks.push_back({e.at("step").get<int64_t>(), e.at("loss").get<double>()});
  const std::vector<std::pair<int64_t, double>> want = {{2, 2.0}, {4, 1.0}, {8, 0.5}};
  EXPECT_EQ(checks, want);

  c.policy = "autofreeze";
  auto autofreeze = freeze::make_policy(c, layers);
  auto step = [&](int64_t k, double grad, bool trained) {
    for (auto& p : m->parameters()) p.set_grad(Tensor::full(p.shape(), grad));
    freeze::StepInfo s;
    s.step = k;
    s.lr = 0.1;
    s.trained = trained;
    autofreeze->after_step(s, Tensor(), Tensor(), *m);
  };
  step(1, 1.0, true);  // the first norms
  step(2, 0.0, false);  // due, but nothing trained
  step(3, 2.0, true);  // the reading: every norm doubled since step 1
  std::vector<nlohmann::json> evaluations;
  for (auto& e : autofreeze->take_log())
    if (e.at("type") == "evaluation") evaluations.push_back(e);
  ASSERT_EQ(evaluations.size(), 1u);
  EXPECT_EQ(evaluations[0].at("step"), 3);
  EXPECT_NEAR(evaluations[0].at("grad_norm_change").get<double>(), 1.0, 1e-6);
}

// A run with an auto n (or bootstrapping span) resumes with its checkpoint's: the build
// that started it may have derived another (n for a pretrained network was 10 before
// Note [n for a pretrained network]), and its readings so far are at that n's steps.
// A set n is the run's own: a resume with another is refused before the policy starts.
TEST(Partition, AnAutoIntervalResumesAsTheCheckpointHasIt) {
  auto m = model("resnet20", 16);
  freeze::PolicyConfig c = egeria_config(*m);
  c.steps_per_epoch = 10;
  c.tracker.pretrained = true;
  const int64_t layers = int64_t(m->layer_modules().size());
  auto started = freeze::make_policy(c, layers);
  ASSERT_EQ(started->stats().at("interval"), freeze::kMinPretrainedInterval);
  nlohmann::json saved = started->state();
  saved["interval"] = 10;  // as the earlier build wrote it
  auto resumed = freeze::make_policy(c, layers);
  resumed->load_state(saved);
  EXPECT_EQ(resumed->stats().at("interval"), 10);
  EXPECT_EQ(resumed->state().at("interval"), 10) << "and checkpoints it again";

  c.tracker.pretrained = false;  // from scratch: the auto span between bootstrapping checks too
  saved = freeze::make_policy(c, layers)->state();
  ASSERT_EQ(saved.at("bootstrap_interval"), 10);
  saved["interval"] = 5;
  saved["bootstrap_interval"] = 7;
  resumed = freeze::make_policy(c, layers);
  resumed->load_state(saved);
  EXPECT_EQ(resumed->stats().at("interval"), 5);
  EXPECT_EQ(resumed->stats().at("bootstrap_interval"), 7);

  c.tracker.interval = 4;  // set: the run's own
  c.tracker.bootstrap_interval = 8;
  resumed = freeze::make_policy(c, layers);
  resumed->load_state(saved);
  EXPECT_EQ(resumed->stats().at("interval"), 4);
  EXPECT_EQ(resumed->stats().at("bootstrap_interval"), 8);
}

}  // namespace
