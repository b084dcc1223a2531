// A user's model and data through the public API (egeria.h): models::register_model,
// train::ImageTask on a user's SampleSources trained by train::fit with Egeria's
// freezing, resume, and --init-from (train::init_from).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "egeria.h"
#include "test_util.h"

namespace eg {
namespace {

using json = nlohmann::json;

nn::ModulePtr conv_block(int64_t in, int64_t out, bool pool, Generator& g) {
  auto b = std::make_shared<nn::Sequential>();
  b->add("conv", std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{1, 1, 1, 1, false}, g));
  b->add("bn", std::make_shared<nn::BatchNorm2d>(out));
  b->add("relu", nn::ReLU());
  if (pool) b->add("pool", nn::MaxPool2d(2, 2));
  return b;
}

// A user's network: three convolution blocks and a head, each a freezing unit.
class UserCnn final : public models::Model {
 public:
  // dropout > 0: a Dropout before the head's linear layer, drawing from g or (not
  // from_g) from the process-wide generator.
  UserCnn(const models::ModelConfig& c, Generator& g, double dropout = 0, bool from_g = true) {
    units_.emplace_back("stem", register_module("stem", conv_block(c.in_channels, 8, false, g)));
    units_.emplace_back("block1", register_module("block1", conv_block(8, 16, true, g)));
    units_.emplace_back("block2", register_module("block2", conv_block(16, 16, true, g)));
    auto head = std::make_shared<nn::Sequential>();
    head->add("pool", std::make_shared<nn::GlobalAvgPool>());
    if (dropout > 0)
      head->add("dropout", from_g ? std::make_shared<nn::Dropout>(dropout, g) : std::make_shared<nn::Dropout>(dropout));
    head->add("fc", std::make_shared<nn::Linear>(16, c.num_classes, true, g));
    units_.emplace_back("head", register_module("head", head));
  }
  std::string type_name() const override { return "UserCnn"; }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& u : units_) h = u.second->forward(h);
    return h;
  }
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return units_; }

 private:
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
};

// Four classes of 1x16x16 images: a bright 6x6 patch in quadrant `label` on noise; the
// training split's noise is drawn anew for every (seed, epoch, id), the test split's
// only for (seed, id).
class QuadrantSamples final : public data::SampleSource {
 public:
  QuadrantSamples(int64_t n, uint64_t salt, bool per_epoch) : n_(n), salt_(salt), per_epoch_(per_epoch) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 16, 16}; }
  int64_t label(int64_t id) const override { return id % 4; }
  void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override {
    const int64_t k = label(id), r0 = k / 2 * 8 + 1, c0 = k % 2 * 8 + 1;
    const uint64_t key = seed * 31 + salt_ + uint64_t(per_epoch_ ? epoch : 0) * 1000003;
    for (int64_t i = 0; i < 256; ++i) {
      const int64_t r = i / 16, c = i % 16;
      const float noise = float(philox4x32(key, uint64_t(id) * 256 + uint64_t(i)).x[0] % 1000) / 1000.f - 0.5f;
      out[i] = noise + ((r >= r0 && r < r0 + 6 && c >= c0 && c < c0 + 6) ? 1.5f : 0.f);
    }
  }
  int64_t n_;
  uint64_t salt_;
  bool per_epoch_;
};

void register_user_cnn() {
  models::register_model("user-cnn", [](const models::ModelConfig& c, Generator& g) -> models::ModelPtr {
    return std::make_shared<UserCnn>(c, g);
  });
}

train::ImageData quadrant_data() {
  train::ImageData d;
  d.train = std::make_shared<QuadrantSamples>(256, 1, true);
  d.test = std::make_shared<QuadrantSamples>(64, 2, false);
  d.classes = {"top-left", "top-right", "bottom-left", "bottom-right"};
  return d;
}

// ResNet-20 sized like the trainer tests' runs (tests/test_util.h), on the user's model.
train::TrainConfig user_run(const std::string& out) {
  train::TrainConfig c = testing::small_image_run(out);
  c.model = "user-cnn";
  c.dataset = "quadrants";
  c.train_limit = c.test_limit = 0;
  c.epochs = 3;
  c.milestones = {2};
  c.log_every = 1;
  c.checkpoint_every = 4;
  testing::use_fast_egeria(c);
  return c;
}

std::vector<json> jsonl(const std::string& path) {
  std::vector<json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) v.push_back(json::parse(line));
  return v;
}

TEST(Api, RegisterModelMakesAUsersModelKnownByName) {
  register_user_cnn();
  const auto names = models::model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "user-cnn"), names.end());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_FALSE(models::is_builtin_model("user-cnn"));
  EXPECT_TRUE(models::is_builtin_model("resnet20"));
  models::ModelConfig mc;
  mc.name = "user-cnn", mc.in_channels = 1, mc.image_size = 16, mc.num_classes = 4;
  Generator g(0);
  auto m = models::build_model(mc, g);
  ASSERT_EQ(m->layer_modules().size(), 4u);
  EXPECT_EQ(m->layer_modules()[0].first, "stem");
  EXPECT_EQ(m->flops_per_sample(), 0);  // not given: reports weigh units by parameters
  // The same architecture (a reference model is built this way), another seed's weights.
  Generator g2(1);
  auto m2 = models::build_model(mc, g2);
  EXPECT_EQ(m2->state_dict().size(), m->state_dict().size());

  EXPECT_NE(testing::error_of([] { models::register_model("resnet20", {}); }).find("'resnet20'"), std::string::npos);
  EXPECT_NE(testing::error_of([] {
              models::register_model("two words", [](const models::ModelConfig& c, Generator& g) -> models::ModelPtr {
                return std::make_shared<UserCnn>(c, g);
              });
            }).find("one word"),
            std::string::npos);
  class NoUnits final : public models::Model {
   public:
    std::string type_name() const override { return "NoUnits"; }
    std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return {}; }
  };
  models::register_model("no-units", [](const models::ModelConfig&, Generator&) -> models::ModelPtr {
    return std::make_shared<NoUnits>();
  });
  mc.name = "no-units";
  EXPECT_NE(testing::error_of([&] { models::build_model(mc, g); }).find("names no layer modules"), std::string::npos);
}

// The user's model on the user's samples through fit(): it learns, Egeria's int8
// reference (built through the registered builder) freezes a unit, and the run's files
// carry the class names.
// `egeria bench step` times whole steps: a model whose loss is not finite (here a user's
// that scales its logits by NaN) is refused by name, not timed as the forward the
// training step stops after.
TEST(Api, BenchStepRefusesAStepWhoseLossIsNotFinite) {
  class NanCnn final : public models::Model {
   public:
    NanCnn(const models::ModelConfig& c, Generator& g) : inner_(std::make_shared<UserCnn>(c, g)) {
      register_module("inner", inner_);
    }
    std::string type_name() const override { return "NanCnn"; }
    Tensor forward(const Tensor& x) override { return fn::scale(inner_->forward(x), std::nan("")); }
    std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override {
      return inner_->layer_modules();
    }

   private:
    std::shared_ptr<UserCnn> inner_;
  };
  models::register_model("nan-cnn", [](const models::ModelConfig& c, Generator& g) -> models::ModelPtr {
    return std::make_shared<NanCnn>(c, g);
  });
  train::StepBenchOptions o;
  o.model = "nan-cnn";
  o.batch_size = 4;
  o.iterations = 1;
  o.threads = 1;
  auto local = dist::make_local();
  const std::string e = testing::error_of([&] { train::bench_step(o, *local); });
  EXPECT_NE(e.find("bench step: the loss became nan at iteration 0 of nan-cnn"), std::string::npos) << e;
}

TEST(Api, FitTrainsAUsersModelOnItsOwnSamplesWithEgeriaFreezing) {
  register_user_cnn();
  const std::string out = testing::fresh_dir("api_fit");
  train::ImageTask task(quadrant_data());
  const train::Summary s = train::fit(task, user_run(out));
  EXPECT_TRUE(s.completed);
  EXPECT_EQ(s.steps, 48);
  EXPECT_GT(s.final_test_accuracy, 0.9) << "four quadrants are easy";
  EXPECT_GT(s.backward_flops_saved_fraction, 0.0) << "nothing froze";
  int64_t freezes = 0, evaluations = 0;
  for (auto& j : jsonl(out + "/freeze.jsonl"))
    freezes += j["type"] == "freeze", evaluations += j["type"] == "evaluation";
  EXPECT_GE(freezes, 1);
  EXPECT_GE(evaluations, 5);
  const json config = json::parse(std::ifstream(out + "/config.json"));
  EXPECT_EQ(config["model"], "user-cnn");
  EXPECT_EQ(config["classes"], json(quadrant_data().classes));
  train::Metadata meta;
  train::load_safetensors(out + "/model.safetensors", &meta);
  EXPECT_EQ(json::parse(meta.at("classes")), json(quadrant_data().classes));
}

TEST(Api, UsersRunStoppedAndResumedEqualsTheUninterruptedOne) {
  register_user_cnn();
  const std::string full = testing::fresh_dir("api_full"), cut = testing::fresh_dir("api_cut");
  {
    train::ImageTask task(quadrant_data());
    ASSERT_TRUE(train::fit(task, user_run(full)).completed);
  }
  for (int64_t stop : {9, 22, 0}) {  // killed after a checkpoint's step + 1, twice; then to the end
    train::TrainConfig c = user_run(cut);
    c.resume = stop != 9;
    c.stop_after_steps = stop;
    train::ImageTask task(quadrant_data());
    EXPECT_EQ(train::fit(task, c).completed, stop == 0);
  }
  auto a = train::load_safetensors(full + "/model.safetensors"),
       b = train::load_safetensors(cut + "/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (auto& [k, t] : a) EXPECT_EQ(t.to_vector<float>(), b.at(k).to_vector<float>()) << k;
  EXPECT_EQ(testing::slurp(full + "/freeze.jsonl").size(), testing::slurp(cut + "/freeze.jsonl").size());
}

TEST(Api, UsersDataIsCheckedInItsOwnTerms) {
  register_user_cnn();
  auto fails = [](train::ImageData d, const std::function<void(train::TrainConfig&)>& change = {}) {
    train::TrainConfig c = user_run(testing::fresh_dir("api_bad"));
    if (change) change(c);
    train::ImageTask task(std::move(d));
    return testing::error_of([&] { train::fit(task, c); });
  };
  train::ImageData d = quadrant_data();
  d.test = nullptr;
  EXPECT_NE(fails(d).find("training and test samples are both needed"), std::string::npos);
  d = quadrant_data();
  d.classes.clear();
  EXPECT_NE(fails(d).find("how many classes?"), std::string::npos);
  d = quadrant_data();
  d.num_classes = 5;
  EXPECT_NE(fails(d).find("4 class names for 5 classes"), std::string::npos);
  class Wide final : public data::SampleSource {
   public:
    int64_t size() const override { return 8; }
    Shape sample_shape() const override { return {1, 16, 20}; }
    int64_t label(int64_t) const override { return 0; }
    void load(int64_t, uint64_t, int64_t, float*) const override {}
  };
  d = quadrant_data();
  d.test = std::make_shared<Wide>();
  EXPECT_NE(fails(d).find("the test samples' shape [1, 16, 20] differs from the training samples' [1, 16, 16]"),
            std::string::npos);
  EXPECT_NE(fails(quadrant_data(), [](train::TrainConfig& c) { c.val_fraction = 0.1; }).find("ImageData::valid"),
            std::string::npos);
  EXPECT_NE(fails(quadrant_data(), [](train::TrainConfig& c) { c.model = "users-cnn"; }).find("unknown model"),
            std::string::npos);
  // Labels 1 to 4 for 4 classes: named with their sample (the loss alone names a target
  // index on the CPU, gives a NaN on a GPU), in training and in evaluation.
  class OffByOne final : public data::SampleSource {
   public:
    int64_t size() const override { return 16; }
    Shape sample_shape() const override { return {1, 16, 16}; }
    int64_t label(int64_t id) const override { return id % 4 + 1; }
    void load(int64_t, uint64_t, int64_t, float* out) const override { std::fill(out, out + 256, 0.f); }
  };
  d = quadrant_data();
  d.train = std::make_shared<OffByOne>();
  std::string msg = fails(d);
  EXPECT_NE(msg.find("the training sample "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" has label 4, but labels are 0 to 3 (4 classes)"), std::string::npos) << msg;
  d = quadrant_data();
  d.test = std::make_shared<OffByOne>();
  msg = fails(d, [](train::TrainConfig& c) { c.epochs = 1; });
  EXPECT_NE(msg.find("the evaluation sample "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" has label 4, but labels are 0 to 3 (4 classes)"), std::string::npos) << msg;
  // The model exists once fit has built it.
  train::ImageTask unbuilt(quadrant_data());
  msg = testing::error_of([&] { unbuilt.model(); });
  EXPECT_NE(msg.find("train::fit builds the model"), std::string::npos) << msg;
}

// fit checkpoints, seeds per rank and replays the generator it gives the builder; a
// Dropout drawing from another one is refused, naming it and the fix.
TEST(Api, FitRefusesADropoutThatDrawsFromAnotherGenerator) {
  for (const bool from_g : {false, true}) {
    models::register_model("user-cnn-dropout",
                           [from_g](const models::ModelConfig& c, Generator& g) -> models::ModelPtr {
                             return std::make_shared<UserCnn>(c, g, 0.2, from_g);
                           });
    train::TrainConfig c = user_run(testing::fresh_dir("api_dropout"));
    c.model = "user-cnn-dropout";
    c.epochs = 1;
    train::ImageTask task(quadrant_data());
    const std::string msg = testing::error_of([&] { train::fit(task, c); });
    if (from_g) {
      EXPECT_EQ(msg, "");
    } else {
      EXPECT_NE(msg.find("its Dropout 'head.dropout' draws from another generator"), std::string::npos) << msg;
      EXPECT_NE(msg.find("pass the builder's Generator& g to nn::Dropout"), std::string::npos) << msg;
    }
  }
}

// PyTorch's load_state_dict(strict=False), with a new head of another size left as initialised.
TEST(Api, InitFromTakesWhatFitsAndNamesTheRest) {
  register_user_cnn();
  const std::string dir = testing::fresh_dir("api_init");
  models::ModelConfig four;
  four.name = "user-cnn", four.in_channels = 1, four.image_size = 16, four.num_classes = 4;
  models::ModelConfig three = four;
  three.num_classes = 3;
  Generator g1(1), g2(2);
  auto source = models::build_model(four, g1);
  train::TensorMap saved = source->state_dict();
  saved.erase("stem.bn.running_var");
  saved["extra.weight"] = Tensor::zeros({2}, DType::f32);
  train::save_safetensors(dir + "/w.safetensors", saved);

  auto target = models::build_model(three, g2);
  const train::TensorMap before = target->state_dict();
  const train::InitFromReport r = train::init_from(*target, dir + "/w.safetensors");
  EXPECT_EQ(r.missing, std::vector<std::string>{"stem.bn.running_var"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra.weight"});
  ASSERT_EQ(r.mismatched.size(), 2u);  // head.fc.bias, head.fc.weight
  EXPECT_EQ(r.mismatched[0], "head.fc.bias [4] vs [3]");
  EXPECT_EQ(r.loaded, int64_t(before.size()) - 3);
  const train::TensorMap after = target->state_dict();
  EXPECT_EQ(after.at("block1.conv.weight").to_vector<float>(), saved.at("block1.conv.weight").to_vector<float>());
  EXPECT_EQ(after.at("head.fc.weight").to_vector<float>(), before.at("head.fc.weight").to_vector<float>());
  const std::string text = r.text("w.safetensors");
  EXPECT_NE(text.find("missing from the file, left as initialised: stem.bn.running_var"), std::string::npos) << text;
  EXPECT_NE(text.find("not in the model, ignored: extra.weight"), std::string::npos) << text;

  // A run's checkpoint: its model's tensors, not the optimizer's.
  train::TensorMap ckpt;
  for (auto& [k, t] : source->state_dict()) ckpt["model/" + k] = t;
  ckpt["optim/0/momentum"] = Tensor::zeros({3}, DType::f32);
  train::save_safetensors(dir + "/checkpoint.safetensors", ckpt);
  auto same = models::build_model(four, g2);
  const train::InitFromReport rc = train::init_from(*same, dir + "/checkpoint.safetensors");
  EXPECT_EQ(rc.loaded, int64_t(source->state_dict().size()));
  EXPECT_TRUE(rc.missing.empty() && rc.unexpected.empty() && rc.mismatched.empty());

  train::save_safetensors(dir + "/other.safetensors", {{"encoder.weight", Tensor::zeros({2}, DType::f32)}});
  EXPECT_NE(testing::error_of([&] {
              train::init_from(*same, dir + "/other.safetensors");
            }).find("none of its 1 tensors fits this model"),
            std::string::npos);
}

// fit() starts a fresh run from --init-from's weights: with a learning rate of 1e-12 the
// trained weights are still the file's; a resume takes the checkpoint's instead.
TEST(Api, FitStartsFromInitFromsWeights) {
  register_user_cnn();
  const std::string a = testing::fresh_dir("api_init_a"), b = testing::fresh_dir("api_init_b");
  train::TrainConfig c = user_run(a);
  c.freezing.policy = "none";
  c.epochs = 1;
  {
    train::ImageTask task(quadrant_data());
    train::fit(task, c);
  }
  c.out = b;
  c.lr = 1e-12;
  c.seed = 9;  // another initialisation, which the file replaces
  c.init_from = a + "/model.safetensors";
  {
    train::ImageTask task(quadrant_data());
    const train::Summary s = train::fit(task, c);
    EXPECT_GT(s.final_test_accuracy, 0.9);
  }
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  for (const char* k : {"stem.conv.weight", "block2.conv.weight", "head.fc.weight"}) {
    const auto va = wa.at(k).to_vector<float>(), vb = wb.at(k).to_vector<float>();
    for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-6) << k << "[" << i << "]";
  }
  c.init_from = b + "/missing.safetensors";
  c.out = testing::fresh_dir("api_init_c");
  train::ImageTask task(quadrant_data());
  EXPECT_NE(testing::error_of([&] { train::fit(task, c); }).find("missing.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace eg
