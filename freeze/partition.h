// Freezing units: how a model's layer modules are grouped into the modules that
// Egeria evaluates and freezes (§4.2.1, the Fig. 11 discussion).
//
// Note [Freezing units]
// A freezing unit is a contiguous run of layer modules (models/model.h), so freezing
// a prefix of units is freezing a prefix of layer modules: the frozen front runs under
// no-grad and its parameters leave the optimizer. Three ways to form them:
//   layers  every layer module is a unit (ResNet-56: stem, 27 residual blocks, head).
//   auto    the paper's partitioning, and the default. Layer modules are grouped by
//           stage (the name before the first '.': "layer1", "layer2", "block3" ...; the
//           stem joins the first stage). A stage much larger than the others is split
//           into contiguous units of similar parameter counts, the size of the
//           largest remaining stage; the last body unit is split once more ("layer
//           3.7-3.8 is further split because it is the last module"). The head stays
//           a unit of its own and is never frozen. ResNet-56 gets 7 units, as in the
//           paper: layer1 (5% of the parameters), layer2 (20%), layer3 in five.
//           Models whose layer-module names carry no stages (MobileNetV2's block0,
//           block1, ...) are cut into units of about equal parameter counts, as many
//           as the auto rule gives a ResNet (7) or fewer when there are fewer modules.
//   regex   --freeze-module-regex RE, the paper's "regular expression" option: every
//           parameter name is searched for RE, and parameters whose match (its first
//           capture group, if it has one) is the same belong to the same unit.
//           Layer modules none of whose parameters match stay units of their own
//           (with '^(layer[0-9]+)\.' a ResNet gets stem, layer1, layer2, layer3, head).
//           Because a unit is made of whole layer modules, a regex that would put the
//           parameters of one layer module into two units is an error, as is one whose
//           groups are not contiguous.
// Finer units cost more evaluations before the front of the network is frozen (W
// stale readings each), coarser ones freeze larger pieces at once.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/model.h"

namespace eg::freeze {

struct FreezeUnit {
  std::string name;  // "layer3.0-2", "layer1", "head"
  int64_t begin = 0, end = 0;  // layer modules [begin, end)
  int64_t params = 0;
};

class Partition {
 public:
  Partition() = default;
  explicit Partition(std::vector<FreezeUnit> units);
  const std::vector<FreezeUnit>& units() const { return units_; }
  int64_t size() const { return int64_t(units_.size()); }
  // Layer modules in the first k units (the layer-module prefix to freeze).
  int64_t layer_prefix(int64_t k) const;
  // The layer modules of these units, ascending.
  std::vector<int64_t> layers_of(const std::vector<int64_t>& units) const;
  // The layer module whose output is unit u's output.
  int64_t last_layer(int64_t u) const { return units_.at(size_t(u)).end - 1; }
  // The unit whose output layer module `layer` is; -1 when it ends none.
  int64_t unit_of_last_layer(int64_t layer) const {
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].end - 1 == layer) return int64_t(u);
    return -1;
  }
  std::vector<std::string> names() const;
  nlohmann::json to_json() const;

 private:
  std::vector<FreezeUnit> units_;
};

// How the layer modules group into units: the paper's (stages, large ones split), or
// one unit per layer module.
enum class PartitionMode { automatic, layers };

// Partitions model m's layer modules; a non-empty `regex` overrides `mode`. Throws
// eg::Error naming the problem for a bad regex.
Partition make_partition(const models::Model& m, PartitionMode mode, const std::string& regex = "");

}  // namespace eg::freeze
