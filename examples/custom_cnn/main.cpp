// custom_cnn: a user's own model and data, trained with Egeria's layer freezing through
// egeria's public API. It shows the three things a program gives the engine:
//   1. a model: a models::Model whose freezing units ("layer modules") are named in
//      order, front to back, and a builder registered under a name, from which the
//      engine also builds Egeria's int8 reference model (then loads a weight snapshot);
//   2. data: a data::SampleSource per split (its size, a sample's shape and label, and
//      sample i for (seed, epoch, i), which the loader's workers call ahead of the step);
//   3. a train::TrainConfig: every `egeria train` flag is a field of it.
// train::fit() then runs the same loop as the CLI: checkpoints and --resume, the logs
// in --out, progress, every freezing policy, and data parallelism under mpirun.
//
//   custom_cnn [--data-dir DIR] [--out DIR] [--epochs N] [--train-limit N] [--resume]
//   custom_cnn train --model small-cnn --dataset fashion-mnist ...   (the egeria CLI, with small-cnn)
// DIR defaults to /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
#include <egeria.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace eg;

namespace {

// conv 3x3 -> BatchNorm -> ReLU, and a 2x2 max pool when `pool`.
nn::ModulePtr conv_block(int64_t in, int64_t out, bool pool, Generator& g) {
  auto b = std::make_shared<nn::Sequential>();
  b->add("conv", std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{1, 1, 1, 1, false}, g));
  b->add("bn", std::make_shared<nn::BatchNorm2d>(out));
  b->add("relu", nn::ReLU());
  if (pool) b->add("pool", nn::MaxPool2d(2, 2));
  return b;
}

// Four freezing units: Egeria freezes a prefix of them, stem first; the head never freezes.
class SmallCnn final : public models::Model {
 public:
  SmallCnn(const models::ModelConfig& c, Generator& g) : side_(c.image_size) {
    stem_ = register_module("stem", conv_block(c.in_channels, 16, false, g));
    block1_ = register_module("block1", conv_block(16, 32, true, g));
    block2_ = register_module("block2", conv_block(32, 64, true, g));
    auto head = std::make_shared<nn::Sequential>();
    head->add("pool", std::make_shared<nn::GlobalAvgPool>());
    head->add("fc", std::make_shared<nn::Linear>(64, c.num_classes, true, g));
    head_ = register_module("head", head);
    in_ = c.in_channels, classes_ = c.num_classes;
  }
  std::string type_name() const override { return "SmallCnn"; }
  Tensor forward(const Tensor& x) override { return (*head_)((*block2_)((*block1_)((*stem_)(x)))); }
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override {
    return {{"stem", stem_}, {"block1", block1_}, {"block2", block2_}, {"head", head_}};
  }
  // Optional (0 by default): lets the freezing report count saved FLOPs, not parameters.
  std::vector<double> module_flops() const override {
    const double s = double(side_) * double(side_);
    return {2 * 9 * double(in_) * 16 * s, 2 * 9 * 16 * 32 * s, 2 * 9 * 32 * 64 * s / 4, 2 * 64 * double(classes_)};
  }
  double flops_per_sample() const override {
    double f = 0;
    for (double m : module_flops()) f += m;
    return f;
  }

 private:
  nn::ModulePtr stem_, block1_, block2_, head_;
  int64_t side_, in_ = 1, classes_ = 10;
};

// Fashion-MNIST from its IDX files, normalised, with a random horizontal flip for
// training that is a pure function of (seed, epoch, id): a resumed, cached or
// data-parallel run sees exactly the samples an uninterrupted one-process run would.
class FashionSamples final : public data::SampleSource {
 public:
  FashionSamples(data::ImageDataset d, bool flip) : d_(std::move(d)), flip_(flip) {}
  int64_t size() const override { return d_.size(); }
  Shape sample_shape() const override { return {1, 28, 28}; }
  int64_t label(int64_t id) const override { return d_.labels.data<int64_t>()[id]; }
  void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override {
    const uint8_t* px = d_.images.data<uint8_t>() + id * 28 * 28;
    const bool mirror = flip_ && (philox4x32(seed ^ 0x666c6970ull, uint64_t(epoch) << 32 | uint64_t(id)).x[0] & 1);
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x)
        out[y * 28 + x] = (float(px[y * 28 + (mirror ? 27 - x : x)]) / 255.f - 0.2860f) / 0.3530f;
  }

 private:
  data::ImageDataset d_;
  bool flip_;
};

const char* arg_value(int& i, int argc, char** argv) {
  EG_CHECK(i + 1 < argc, argv[i], " needs a value");
  return argv[++i];
}

}  // namespace

int main(int argc, char** argv) try {
  // Known to build_model, fit(), Egeria's reference and the CLI from here on.
  models::register_model("small-cnn", [](const models::ModelConfig& c, Generator& g) -> models::ModelPtr {
    return std::make_shared<SmallCnn>(c, g);
  });
  // This program is also an egeria CLI that knows small-cnn: `custom_cnn train --model small-cnn ...`.
  if (argc > 1 && (!std::strcmp(argv[1], "train") || !std::strcmp(argv[1], "eval") || !std::strcmp(argv[1], "bench")))
    return run_cli(argc, argv);

  train::TrainConfig c;  // the defaults of `egeria train`
  std::string dir = "/usr/share/datasets/fashion-mnist";
  c.model = "small-cnn";
  c.dataset = "fashion-mnist (custom_cnn's FashionSamples)";  // a name for the logs
  c.out = "runs/custom_cnn";
  c.epochs = 3;
  c.batch_size = 64;
  c.lr = 0.05;
  c.weight_decay = 5e-4;
  c.lr_schedule = train::Schedule::cosine;
  c.freezing.policy = "egeria";  // the int8 reference runs beside training; frozen units skip their backward
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data-dir") dir = arg_value(i, argc, argv);
    else if (a == "--out") c.out = arg_value(i, argc, argv);
    else if (a == "--epochs") c.epochs = std::atoll(arg_value(i, argc, argv));
    else if (a == "--train-limit") c.train_limit = std::atoll(arg_value(i, argc, argv));
    else if (a == "--test-limit") c.test_limit = std::atoll(arg_value(i, argc, argv));
    else if (a == "--resume") c.resume = true;
    else if (a == "--quick") {  // short-run settings (the test suite's): Egeria decides within a few hundred steps
      c.freezing.tracker.interval = 2;  // a plasticity reading every 2 steps (the paper's guideline: an epoch's share)
      c.freezing.tracker.bootstrap_interval = -1;  // bootstrapping checked every n steps
      c.freezing.tracker.window = 2;  // W readings in the slope's window
      c.freezing.tracker.tolerance_coef = 0.5;  // T = half the largest early slope (the paper: 0.2)
      c.freezing.reference.synchronous = true;  // the reference evaluated inline: the same decisions every run
      c.freezing.units = train::FreezeUnits::layers;  // every layer module its own unit
    } else {
      EG_THROW("unknown argument '", a, "' (--data-dir DIR, --out DIR, --epochs N, --train-limit N, --test-limit N, ",
               "--resume, --quick; or train/eval/bench for the egeria CLI)");
    }
  }

  train::ImageData data;
  data.train = std::make_shared<FashionSamples>(data::load_mnist_split(dir, "train"), true);
  data.test = std::make_shared<FashionSamples>(data::load_mnist_split(dir, "t10k"), false);
  data.classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  train::ImageTask task(data);
  const train::Summary s = train::fit(task, c);

  std::printf("custom_cnn: test accuracy %.2f%% after %lld steps, %.1f s of training\n", 100 * s.final_test_accuracy,
              (long long)s.steps, s.train_seconds);
  if (!s.freeze_report.empty()) std::printf("%s\n", s.freeze_report.c_str());
  std::printf("custom_cnn: backward FLOPs saved by freezing: %.1f%%; the run's files are in %s\n",
              100 * s.backward_flops_saved_fraction, c.out.c_str());
  return s.completed ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_cnn: error: %s\n", e.what());
  return 1;
}
