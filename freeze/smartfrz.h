// SmartFRZ's parts (Li et al., ICLR 2023): the tailored weight histories it reads and the
// attention-based predictor that reads them. The policy that uses them is
// freeze/policy_smartfrz.cpp.
//
// Note [SmartFRZ's weight histories]
// Every `record_every` steps the policy records, for each unit still training, a fixed
// subset of the unit's weights ("layer tailoring"): `tailor` positions drawn once, from
// the run's seed and the unit's index, over the unit's parameters of two or more
// dimensions (convolution, linear and embedding weights; biases and norm parameters are
// a small share and move on another scale), with replacement only where the unit has
// fewer weights than positions. The positions stay the same for the whole run, so a
// window holds one set of weights over time (the third-party port draws new positions
// at every snapshot). A unit's window keeps its last `window` records.
//
// Note [SmartFRZ's predictor input]
// The predictor sees a window as `window` rows of `tailor` features, oldest first:
// row t is (w_t - mean over the window of w) / rms(w_newest) * gain, per position. So
// it reads how the weights moved within the window relative to their size, not their
// raw values: one predictor serves units of every size and initialisation, and a unit
// whose weights stand still gives rows of zeros. `gain` (in the predictor's file) brings
// the typical movement to order one.
// Such movement shrinks with the learning rate whatever the unit's representation does:
// under a linear decay every unit looks converged as the LR nears 0. A predictor of input
// `movement-per-lr` reads the window's path with each step between records divided by the
// mean LR of the training steps it spans (u_0 = w_0, u_t = u_{t-1} + (w_t - w_{t-1}) /
// lr_t), then as above: (u_t - mean of u) / rms(w_newest) * gain. Under SGD (momentum
// included) and Adam an update is the LR times something the LR does not scale, so this
// reads the optimiser's direction and its noise, whatever the schedule; a step with LR 0
// adds nothing. Such a predictor's file is format 2 (format 1 files read `movement`).
//
// Note [SmartFRZ's predictor]
// Three MLPs of the same shape (tailor -> hidden -> hidden -> dim, ReLU between) give the
// query of the newest row and the keys and values of the older ones; the attention
// weights are the softmax of the scaled dot products q.k / sqrt(dim), per sample; their
// weighted sum of the values goes through a head (dim -> head -> head -> 2, ReLU
// between) to two logits, "keep" (0) and "freeze" (1). About 1 M parameters at the
// defaults. Built from egeria's own layers, so it trains with egeria's autograd and
// optimizers (bench/, offline) as any model does.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "freeze/partition.h"
#include "layers/layers.h"
#include "models/model.h"

namespace eg::freeze {

// What the predictor reads (Note [SmartFRZ's predictor input]).
enum class SmartFrzInput { movement, movement_per_lr };
const char* smartfrz_input_name(SmartFrzInput i);
std::optional<SmartFrzInput> find_smartfrz_input(const std::string& name);  // nullopt: no such input
SmartFrzInput parse_smartfrz_input(const std::string& name);  // a named error for another name

// The predictor's shape and how its input is made: in its file's metadata.
struct SmartFrzGeometry {
  int64_t tailor = 1024;  // weights per record (the input width)
  int64_t hidden = 256;
  int64_t dim = 64;  // query, key and value width
  int64_t head = 32;
  int64_t window = 30;  // the window it was trained on: the policy's default
  double gain = 100;  // Note [SmartFRZ's predictor input]
  SmartFrzInput input = SmartFrzInput::movement;
  // The file's metadata, and back; named errors for a missing or malformed entry.
  std::map<std::string, std::string> to_metadata() const;
  static SmartFrzGeometry from_metadata(const std::map<std::string, std::string>& meta, const std::string& file);
};

// Format 1 reads `movement`; format 2 names its input in the metadata, so that an egeria
// that knows only format 1 refuses it rather than misread it.
inline constexpr const char* kSmartFrzFormat = "egeria-smartfrz-predictor-1";
inline constexpr const char* kSmartFrzFormat2 = "egeria-smartfrz-predictor-2";

class SmartFrzPredictor : public nn::Module {
 public:
  explicit SmartFrzPredictor(const SmartFrzGeometry& g, Generator& gen = default_generator());
  // windows [B, M, tailor] (features, oldest first; M >= 2) -> logits [B, 2].
  Tensor forward(const Tensor& windows) override;
  // The probability of "freeze" for each window (no autograd).
  std::vector<double> freeze_probability(const Tensor& windows);
  std::string type_name() const override { return "SmartFrzPredictor"; }
  // Loads a trained predictor's weights, naming every tensor that is missing, unexpected
  // or of another shape (`file` in the message).
  void load(const std::map<std::string, Tensor>& weights, const std::string& file);
  const SmartFrzGeometry& geometry() const { return g_; }

 private:
  SmartFrzGeometry g_;
  std::shared_ptr<nn::Sequential> query_, key_, value_, head_;
};

// The rows of Note [SmartFRZ's predictor input] from raw records [M, tailor], oldest
// first. `lrs` (M values, record t's the mean LR of the steps since record t - 1; the
// oldest one's unused) selects `movement-per-lr`; empty, `movement`.
Tensor smartfrz_features(const Tensor& records, double gain, const std::vector<float>& lrs = {});

// Note [SmartFRZ's weight histories]: the positions one unit records.
struct TailorPosition {
  int64_t param;  // index into the unit's recorded parameters
  int64_t offset;  // flat index within it
};
std::vector<TailorPosition> tailor_positions(const std::vector<int64_t>& param_numels, int64_t tailor, uint64_t seed,
                                             int64_t unit);

// Note [SmartFRZ's weight histories]: reads each unit's tailored weights from a model,
// on whatever device it trains (a gather there, only `tailor` values per unit come to
// the host). Units without parameters record nothing (empty()).
class TailoredWeights {
 public:
  TailoredWeights(models::Model& m, const Partition& units, int64_t tailor, uint64_t seed);
  bool empty(int64_t unit) const { return units_.at(size_t(unit)).params.empty(); }
  std::vector<float> read(int64_t unit) const;  // `tailor` values
  int64_t tailor() const { return tailor_; }

 private:
  struct Unit {
    std::vector<Tensor> params;  // the recorded ones
    std::vector<Tensor> ids;  // by parameter: the flat offsets recorded (s64, on its device)
    std::vector<std::vector<int64_t>> slots;  // by parameter: where each lands in the record
  };
  int64_t tailor_;
  std::vector<Unit> units_;
};

}  // namespace eg::freeze
