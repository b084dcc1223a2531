// PyTorch interop: a built-in model's state dict in torchvision's names, and back (Note
// [torchvision names] in models/model.h). The safetensors files of either side are read
// and written by train/; these functions only rename.
#pragma once
#include <map>
#include <string>

#include "models/model.h"

namespace eg::models {

using TensorDict = std::map<std::string, Tensor>;

// egeria's name -> torchvision's, for every tensor of m's state dict. Throws when m has
// no torchvision counterpart.
std::map<std::string, std::string> torchvision_names(const Model& m);

// What `torchvision.models.<model>().load_state_dict(sd, strict=True)` takes: m's state
// dict (the live tensors) under torchvision's names, with each BatchNorm's
// num_batches_tracked, which egeria does not count (0; PyTorch reads it only for
// momentum=None). Throws when m computes something else than torchvision's network
// (TorchvisionNames::differs): its weights would not mean the same there.
TensorDict to_torchvision(const Model& m);

// Whether `file` is in torchvision's names for m: one of its names is torchvision's and
// not egeria's.
bool has_torchvision_names(const Model& m, const TensorDict& file);

// `file` in egeria's names: the names of m's torchvision table renamed, BatchNorm's
// num_batches_tracked left out, every other name kept as it is (for the caller to report).
TensorDict from_torchvision(const Model& m, const TensorDict& file);

}  // namespace eg::models
