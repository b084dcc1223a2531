#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/parallel.h"
#include "optim/optimizer.h"
#include "quant/reference.h"
#include "train/checkpoint.h"
#include "train/image_task.h"
#include "train/translation_task.h"

namespace eg::train {

using json = nlohmann::json;

Summary run_training(const TrainConfig& c) {
  validate(c);
  if (is_translation_model(c.model)) return run_translation(c);
  ImageTask task;
  return fit(task, c);
}

Summary run_translation(const TrainConfig& c, const models::TransformerConfig* arch) {
  TranslationTask task(arch ? std::optional<models::TransformerConfig>(*arch) : std::nullopt);
  return fit(task, c);
}

namespace {

TensorMap model_tensors(const TensorMap& all) {
  TensorMap ms;
  for (auto& [k, t] : all)
    if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
  return ms;
}

EvalResult evaluate_translation_checkpoint(const Checkpoint& ck, const std::string& data_dir, int64_t test_limit,
                                           const std::string& precision) {
  const json& cfg = ck.config;
  EG_CHECK(cfg.contains("arch") && cfg.contains("vocab_size"), "'", ck.path,
           "' has no Transformer architecture in its metadata");
  const std::string dir = translation_data_dir(data_dir.empty() ? cfg.value("data_dir", "") : data_dir);
  data::Tokenizer tok = data::Tokenizer::load(data::tokenizer_path(dir, cfg.at("vocab_size")));
  const TextSplit test = read_text_split(dir, "test", test_limit, tok, cfg.at("max_len"), false);
  models::TransformerConfig mc = arch_from_json(cfg.at("arch"));
  EG_CHECK(mc.vocab == tok.vocab_size(), "tokenizer '", tok.path(), "' has ", tok.vocab_size(), " pieces, but '",
           ck.path, "' was trained with ", mc.vocab, " (was the tokenizer retrained?)");
  Generator g(0);
  auto m = std::make_shared<models::Transformer>(mc, g);
  m->load_state_dict(model_tensors(ck.tensors));
  if (precision == "int8") quant::convert_to_int8(*m);  // every Linear dynamically quantised
  Metrics e = evaluate_translation(*m, test, tok, Device::cpu());
  EvalResult r;
  r.loss = e.at("loss");
  r.bleu = e.at("bleu");
  r.translation = true;
  r.samples = test.pairs->size();
  return r;
}

}  // namespace

EvalResult evaluate_checkpoint(const std::string& out, const std::string& data_dir, int64_t test_limit,
                               const std::string& precision, int64_t calibration_batches) {
  EG_CHECK(precision == "fp32" || precision == "int8", "eval: unknown precision '", precision, "' (fp32, int8)");
  Checkpoints ckpts(out, 1, {});
  EG_CHECK(ckpts.any(), "cannot open '", ckpts.newest_path(), "': no checkpoint in '", out, "'");
  const Checkpoint ck = ckpts.load();
  const json& cfg = ck.config;
  if (is_translation_model(cfg.at("model")))
    return evaluate_translation_checkpoint(ck, data_dir, test_limit, precision);
  const std::string dataset = cfg.at("dataset");
  data::ImageDataset test =
      data::load_image_dataset({dataset, data_dir.empty() ? cfg.value("data_dir", "") : data_dir, test_limit}, false);
  models::ModelConfig mc;
  mc.name = cfg.at("model");
  mc.in_channels = test.images.size(1);
  mc.image_size = test.images.size(2);
  mc.num_classes = num_classes(dataset);
  Generator g(0);
  auto m = models::build_model(mc, g);
  m->load_state_dict(model_tensors(ck.tensors));
  if (precision == "int8") quant::convert_to_int8(*m, calibration_batches);
  Metrics e = evaluate_images(*m, test, dataset, Device::cpu());
  return {e.at("accuracy"), e.at("loss"), test.size()};
}

StepBench bench_step(const std::string& model, int64_t bs, const std::string& device, int iters, int threads) {
  using Clock = std::chrono::steady_clock;
  EG_CHECK(bs > 0 && iters > 0, "bench step: batch size and iterations must be positive");
  set_num_threads(threads);
  Device dev = Device::parse(device);
  models::ModelConfig mc;
  mc.name = model;
  mc.image_size = model == "resnet50" || model == "resnet18" ? 224 : 32;
  mc.small_input = mc.image_size == 32;
  mc.num_classes = model == "resnet50" || model == "resnet18" ? 1000 : 10;
  Generator g(0);
  auto m = models::build_model(mc, g);
  m->to(dev);
  optim::SGD opt(m->parameters(), 0.01, {0.9, 0, 5e-4, false});
  Tensor x = Tensor::randn({bs, 3, mc.image_size, mc.image_size}, g).to(dev);
  std::vector<int64_t> labels(static_cast<size_t>(bs));
  for (int64_t i = 0; i < bs; ++i) labels[size_t(i)] = i % mc.num_classes;
  Tensor y = Tensor::from_vector(labels, {bs}, dev);
  std::vector<double> ms;
  const int warmup = 3;
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = Clock::now();
    Tensor loss = fn::cross_entropy(m->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    (void)loss.item();  // waits for the device
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  StepBench r;
  r.iterations = iters;
  r.median_step_ms = ms[ms.size() / 2];
  r.samples_per_second = double(bs) / (r.median_step_ms / 1000);
  return r;
}

}  // namespace eg::train
