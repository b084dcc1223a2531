// The egeria side of tests/test_torchvision_interop.py (PyTorch's side is the script):
//   interop_check load MODEL CLASSES WEIGHTS INPUTS OUTPUTS
//     builds MODEL (resnet18, resnet50, mobilenetv2) for INPUTS' images, starts it from
//     WEIGHTS through --init-from's code (torchvision's names), and writes its eval-mode
//     outputs on INPUTS' "x" as OUTPUTS' "y". Every tensor must load.
//   interop_check export MODEL CLASSES STEPS INPUTS WEIGHTS OUTPUTS
//     builds MODEL, trains it STEPS SGD steps on random batches (so that the batch
//     norms' running statistics are not their initial ones), writes it in torchvision's
//     names to WEIGHTS, and its eval-mode outputs on INPUTS' "x" to OUTPUTS.
#include <egeria.h>

#include <cstdio>
#include <string>

using namespace eg;

namespace {

models::ModelPtr build(const std::string& name, int64_t classes, const Tensor& x, Generator& g) {
  models::ModelConfig mc;
  mc.name = name, mc.num_classes = classes, mc.in_channels = x.size(1), mc.image_size = x.size(2);
  mc.small_input = mc.image_size <= 64;
  return models::build_model(mc, g);
}

void write_outputs(models::Model& m, const Tensor& x, const std::string& path) {
  m.eval();
  autograd::NoGradGuard ng;
  train::save_safetensors(path, {{"y", m.forward(x)}});
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string cmd = argc > 1 ? argv[1] : "";
  EG_CHECK((cmd == "load" && argc == 7) || (cmd == "export" && argc == 8),
           "usage: interop_check load MODEL CLASSES WEIGHTS INPUTS OUTPUTS | export MODEL CLASSES STEPS INPUTS "
           "WEIGHTS OUTPUTS");
  const std::string name = argv[2];
  const int64_t classes = std::stoll(argv[3]);
  Generator g(7);
  if (cmd == "load") {
    const Tensor x = train::load_safetensors(argv[5]).at("x");
    auto m = build(name, classes, x, g);
    const train::InitFromReport r = train::init_from(*m, argv[4], {{}, Shape(x.shape().begin() + 1, x.shape().end())});
    std::printf("%s\n", r.text(argv[4]).c_str());
    EG_CHECK(r.missing.empty() && r.mismatched.empty() && r.unexpected.empty() && r.names != "egeria",
             "not every tensor was loaded from torchvision's names");
    write_outputs(*m, x, argv[6]);
    return 0;
  }
  const int64_t steps = std::stoll(argv[4]);
  const Tensor x = train::load_safetensors(argv[5]).at("x");
  auto m = build(name, classes, x, g);
  optim::SGD opt(m->parameters(), 0.05, {0.9});
  nn::CrossEntropyLoss loss_fn;
  m->train();
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor xb = Tensor::randn({4, x.size(1), x.size(2), x.size(3)}, g);
    std::vector<int64_t> labels(4);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t((size_t(s) + i) % size_t(classes));
    Tensor loss = loss_fn(m->forward(xb), Tensor::from_vector(labels, {4}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  train::save_safetensors(argv[6], models::to_torchvision(*m));
  write_outputs(*m, x, argv[7]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "interop_check: %s\n", e.what());
  return 1;
}
