#include "train/export.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/dataset.h"
#include "models/torchvision.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

// The run's weights: the final model, else the best epoch's, else the newest checkpoint's.
TensorMap run_weights(const std::string& dir, Metadata& meta, std::string& from) {
  for (const char* f : {"model.safetensors", "best.safetensors"}) {
    from = dir + "/" + f;
    if (file_exists(from)) return load_safetensors(from, &meta);
  }
  Checkpoints ckpts(dir, 1, {});
  EG_CHECK(ckpts.any(), "export: '", dir, "' holds no model.safetensors, best.safetensors or checkpoint");
  const Checkpoint ck = ckpts.load("export");
  from = ck.path;
  return model_tensors(ck.tensors);
}

// What the run's model was built for: its classes and its input's [C, H, W].
models::ModelConfig run_model_config(const json& cfg, const Metadata& meta) {
  models::ModelConfig mc;
  mc.name = cfg.at("model").get<std::string>();
  const std::string dataset = cfg.value("dataset", "");
  const bool folder = !dataset.empty() && data::dataset_info(dataset).kind == data::DataKind::image_folder;
  Shape shape;
  if (auto it = meta.find("sample_shape"); it != meta.end()) shape = json::parse(it->second).get<Shape>();
  else if (folder) {
    const int64_t size = cfg.value("image_size", int64_t(0));
    shape = {cfg.value("image_channels", int64_t(3)), size > 0 ? size : 224, size > 0 ? size : 224};
  }
  EG_CHECK(shape.size() == 3, "export: the run's weights do not say the image shape they were trained on (a run of ",
           "an earlier egeria); train or fine-tune it again to export it");
  mc.in_channels = shape[0], mc.image_size = shape[1], mc.small_input = shape[1] <= 64;
  if (cfg.contains("classes") && cfg["classes"].is_array()) mc.num_classes = int64_t(cfg["classes"].size());
  else if (cfg.contains("select_classes") && !cfg["select_classes"].empty())
    mc.num_classes = int64_t(cfg["select_classes"].size());
  else if (cfg.contains("num_classes")) mc.num_classes = cfg["num_classes"].get<int64_t>();
  else mc.num_classes = data::dataset_info(dataset).classes;
  return mc;
}

}  // namespace

ExportResult export_weights(const std::string& run_dir, const std::string& format, const std::string& to) {
  EG_CHECK(format == "torchvision", "export: unknown --format '", format, "' (torchvision)");
  std::ifstream f(run_dir + "/config.json");
  EG_CHECK(f.good(), "export: '", run_dir, "' has no config.json: is it a run's directory (train's --out)?");
  json cfg;
  try {
    cfg = json::parse(f);
  } catch (const json::exception& e) {
    EG_THROW("export: '", run_dir, "/config.json' is not valid JSON: ", e.what());
  }
  ExportResult r;
  Metadata meta;
  const TensorMap weights = run_weights(run_dir, meta, r.from);
  const models::ModelConfig mc = run_model_config(cfg, meta);
  Generator g(0);
  models::ModelPtr m = models::build_model(mc, g);
  m->load_state_dict(weights, true);
  const models::TorchvisionNames tv = m->torchvision();
  EG_CHECK(tv.any(), "export: --model ", mc.name, " has no torchvision counterpart (torchvision's names are known ",
           "for resnet18, resnet50 and mobilenetv2)");
  EG_CHECK(mc.in_channels == 3, "export: torchvision's ", tv.model, " takes 3-channel images; this run's have ",
           mc.in_channels);
  const TensorMap out = models::to_torchvision(*m);
  save_safetensors(to, out, {{"format", "pt"}, {"torchvision_model", tv.model}});
  r.model = tv.model + "(num_classes=" + std::to_string(mc.num_classes) + ")";
  r.tensors = int64_t(out.size());
  return r;
}

}  // namespace eg::train
