// A run that starts from given weights: --init-from (a run's, or torchvision's).
#pragma once
#include <string>
#include <vector>

#include "models/model.h"

namespace eg::train {

// --init-from: a run starts from the weights in `path` (a model.safetensors or
// best.safetensors, or a checkpoint, whose "model/" tensors are taken; or torchvision's
// state dict of the same network, Note [torchvision names]), copied into `m` where a name
// and its shape match, as PyTorch's load_state_dict(strict=False). Left at their
// initialisation: tensors the file lacks, the tensors `exclude` names (a name or a module
// path: "head", "head.fc.weight"; torchvision's names too), and tensors of the head (the
// last layer module) whose shape differs (a new number of classes). Throws naming every
// such tensor when another tensor's shape differs (a file of another architecture, or
// images of other channels), when none fits, when an `exclude` entry names nothing, or
// when the file records another sample shape than `sample_shape`.
struct InitFromOptions {
  std::vector<std::string> exclude;  // --init-exclude
  Shape sample_shape;  // the data's [C, H, W]; empty: not checked
};
struct InitFromReport {
  int64_t loaded = 0;
  std::string names = "egeria";  // or "torchvision's resnet50" (the file's names)
  std::vector<std::string> missing;  // in the model, not in the file: left as initialised
  std::vector<std::string> unexpected;  // in the file, not in the model: ignored
  std::vector<std::string> mismatched;  // the head's, in both with other shapes: left as initialised
  std::vector<std::string> excluded;  // named by `exclude`: left as initialised
  std::string text(const std::string& path) const;  // what a user is told
};
InitFromReport init_from(models::Model& m, const std::string& path, const InitFromOptions& o = {});

}  // namespace eg::train
