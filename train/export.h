// `egeria export`: a run's weights for another framework. torchvision: the state dict
// that torchvision.models.<name>().load_state_dict(..., strict=True) takes (Note
// [torchvision names] in models/model.h), as safetensors.
#pragma once
#include <string>

namespace eg::train {

struct ExportResult {
  std::string from;  // the weights file read
  std::string model;  // torchvision's builder and its arguments: "resnet50(num_classes=5)"
  int64_t tensors = 0;
};

// Reads the run in `run_dir` (its config.json and model.safetensors, else
// best.safetensors, else its newest checkpoint's model) and writes `to` atomically in
// `format` ("torchvision"). Throws naming what is missing, or why the model is not
// torchvision's (a 32x32 variant; a model torchvision has not).
ExportResult export_weights(const std::string& run_dir, const std::string& format, const std::string& to);

}  // namespace eg::train
