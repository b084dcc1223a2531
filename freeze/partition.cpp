#include "freeze/partition.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include "core/error.h"

namespace eg::freeze {

Partition::Partition(std::vector<FreezeUnit> units) : units_(std::move(units)) {
  int64_t at = 0;
  for (auto& u : units_) {
    EG_CHECK(u.begin == at && u.end > u.begin, "freezing unit '", u.name, "' is not the next run of layer modules");
    at = u.end;
  }
}

int64_t Partition::layer_prefix(int64_t k) const {
  if (k <= 0) return 0;
  EG_CHECK(k <= size(), "a frozen prefix of ", k, " units, but the partition has ", size());
  return units_[size_t(k - 1)].end;
}

std::vector<int64_t> Partition::layers_of(const std::vector<int64_t>& units) const {
  std::vector<int64_t> layers;
  for (int64_t u : units) {
    EG_CHECK(u >= 0 && u < size(), "frozen unit ", u, ", but the partition has ", size());
    for (int64_t i = units_[size_t(u)].begin; i < units_[size_t(u)].end; ++i) layers.push_back(i);
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

std::vector<std::string> Partition::names() const {
  std::vector<std::string> n;
  for (auto& u : units_) n.push_back(u.name);
  return n;
}

nlohmann::json Partition::to_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (auto& u : units_) a.push_back({{"name", u.name}, {"layers", {u.begin, u.end}}, {"params", u.params}});
  return a;
}

namespace {

struct Layer {
  std::string name, stage;
  int64_t params;
};

std::string stage_of(const std::string& name) { return name.substr(0, name.find('.')); }

// Cuts layers [b, e) into k contiguous, non-empty pieces whose largest parameter
// count is as small as it can be (the linear-partition problem; n is small, O(k n^2)).
std::vector<std::pair<int64_t, int64_t>> chunk(const std::vector<Layer>& L, int64_t b, int64_t e, int64_t k) {
  const int64_t n = e - b;
  k = std::max<int64_t>(1, std::min(k, n));
  std::vector<double> pre(size_t(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) pre[size_t(i) + 1] = pre[size_t(i)] + double(L[size_t(b + i)].params);
  const double inf = 1e300;
  // cost[j][i]: the best largest piece cutting the first i layers into j pieces.
  std::vector<std::vector<double>> cost(size_t(k) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(size_t(k) + 1, std::vector<int64_t>(size_t(n) + 1, 0));
  cost[0][0] = 0;
  for (int64_t j = 1; j <= k; ++j)
    for (int64_t i = j; i <= n; ++i)
      for (int64_t c = j - 1; c < i; ++c) {
        const double v = std::max(cost[size_t(j - 1)][size_t(c)], pre[size_t(i)] - pre[size_t(c)]);
        if (v < cost[size_t(j)][size_t(i)]) cost[size_t(j)][size_t(i)] = v, from[size_t(j)][size_t(i)] = c;
      }
  std::vector<std::pair<int64_t, int64_t>> out(static_cast<size_t>(k));
  for (int64_t j = k, i = n; j >= 1; --j) {
    const int64_t c = from[size_t(j)][size_t(i)];
    out[size_t(j - 1)] = {b + c, b + i};
    i = c;
  }
  return out;
}

std::string unit_name(const std::vector<Layer>& L, int64_t b, int64_t e,
                      const std::map<std::string, int64_t>& stage_size) {
  // Whole stages: their names joined ("stem+layer1", "layer2").
  std::string joined;
  int64_t covered = 0;
  for (int64_t i = b; i < e; ++i)
    if (i == b || L[size_t(i)].stage != L[size_t(i - 1)].stage) {
      joined += (joined.empty() ? "" : "+") + L[size_t(i)].stage;
      covered += stage_size.at(L[size_t(i)].stage);
    }
  const bool starts = b == 0 || L[size_t(b - 1)].stage != L[size_t(b)].stage;
  if (starts && covered == e - b) return joined;
  if (e - b == 1) return L[size_t(b)].name;
  const std::string& f = L[size_t(b)].name;
  const std::string& l = L[size_t(e - 1)].name;
  const std::string pf = L[size_t(b)].stage + ".";
  if (L[size_t(b)].stage == L[size_t(e - 1)].stage && f.size() > pf.size() && l.size() > pf.size())
    return f + "-" + l.substr(pf.size());
  return f + "-" + l;
}

std::vector<FreezeUnit> finish(const std::vector<Layer>& L, const std::vector<std::pair<int64_t, int64_t>>& cuts) {
  std::map<std::string, int64_t> stage_size;
  for (auto& l : L) ++stage_size[l.stage];
  std::vector<FreezeUnit> u;
  for (auto [b, e] : cuts) {
    int64_t p = 0;
    for (int64_t i = b; i < e; ++i) p += L[size_t(i)].params;
    u.push_back({unit_name(L, b, e, stage_size), b, e, p});
  }
  return u;
}

// The paper's partitioning; see Note [Freezing units].
std::vector<std::pair<int64_t, int64_t>> auto_cuts(const std::vector<Layer>& L) {
  const int64_t body = int64_t(L.size()) - 1;  // the last layer module is the head
  // Stages in order, the stem (a first stage of one layer module) joined to the next.
  std::vector<std::pair<int64_t, int64_t>> stages;
  for (int64_t i = 0; i < body; ++i)
    if (stages.empty() || L[size_t(i)].stage != L[size_t(i - 1)].stage) stages.emplace_back(i, i + 1);
    else stages.back().second = i + 1;
  if (stages.size() >= 2 && stages[0].second - stages[0].first == 1 && stages[1].second - stages[1].first > 1) {
    stages[1].first = 0;
    stages.erase(stages.begin());
  }
  bool staged = stages.size() >= 2;
  for (auto [b, e] : stages) staged = staged && e - b < body;
  std::vector<std::pair<int64_t, int64_t>> cuts;
  auto params = [&](std::pair<int64_t, int64_t> s) {
    double p = 0;
    for (int64_t i = s.first; i < s.second; ++i) p += double(L[size_t(i)].params);
    return p;
  };
  if (!staged || int64_t(stages.size()) == body) {
    // No stages to follow (every body module is its own "stage"): equal shares.
    cuts = chunk(L, 0, body, std::min<int64_t>(6, body));
  } else {
    // The size units should have: that of the largest stage but one.
    std::vector<double> sizes;
    for (auto& s : stages) sizes.push_back(params(s));
    std::vector<double> sorted = sizes;
    std::sort(sorted.rbegin(), sorted.rend());
    const double tau = std::max(sorted[1], 1.0);
    for (size_t j = 0; j < stages.size(); ++j) {
      const int64_t k = std::max<int64_t>(1, std::llround(sizes[j] / tau));
      for (auto c : chunk(L, stages[j].first, stages[j].second, k)) cuts.push_back(c);
    }
    // "Layer 3.7-3.8 is further split because it is the last module."
    auto last = cuts.back();
    if (last.second - last.first > 1) {
      cuts.pop_back();
      for (auto c : chunk(L, last.first, last.second, 2)) cuts.push_back(c);
    }
  }
  cuts.emplace_back(body, body + 1);
  return cuts;
}

// Returns the cuts and, in `names`, each unit's regex key (or its layer module's name).
std::vector<std::pair<int64_t, int64_t>> regex_cuts(const models::Model& m, const std::vector<Layer>& L,
                                                    const std::string& re_text, std::vector<std::string>* names) {
  std::regex re;
  try {
    re = std::regex(re_text, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    EG_THROW("--freeze-module-regex '", re_text, "' is not a valid regular expression: ", e.what());
  }
  auto mods = m.layer_modules();
  std::vector<std::string> key(L.size());
  std::vector<bool> matched(L.size(), false);
  for (size_t i = 0; i < L.size(); ++i) {
    std::string first_param;
    for (auto& [pn, p] : mods[i].second->named_parameters()) {
      const std::string full = L[i].name + "." + pn;
      std::smatch mt;
      if (!std::regex_search(full, mt, re)) continue;
      const std::string k = mt.size() > 1 && mt[1].matched ? mt[1].str() : mt[0].str();
      if (!matched[i]) {
        matched[i] = true;
        key[i] = k;
        first_param = full;
      } else {
        EG_CHECK(key[i] == k, "--freeze-module-regex '", re_text, "' puts parameters of layer module '", L[i].name,
                 "' into two units ('", first_param, "' -> '", key[i], "', '", full, "' -> '", k,
                 "'); a unit is made of whole layer modules");
      }
    }
  }
  bool any = false;
  for (size_t i = 0; i < L.size(); ++i) {
    any = any || matched[i];
    if (!matched[i]) key[i] = std::string(1, '\x01') + L[i].name;  // unmatched: a unit of its own
  }
  EG_CHECK(any, "--freeze-module-regex '", re_text, "' matches none of the model's parameter names (they look like '",
           L[0].name, ".",
           mods[0].second->named_parameters().empty() ? "weight" : mods[0].second->named_parameters()[0].first, "')");
  std::vector<std::pair<int64_t, int64_t>> cuts;
  std::map<std::string, bool> seen;
  for (size_t i = 0; i < L.size(); ++i) {
    if (i > 0 && key[i] == key[i - 1]) {
      cuts.back().second = int64_t(i) + 1;
      continue;
    }
    EG_CHECK(!seen[key[i]], "--freeze-module-regex '", re_text, "': the parameters matching '", key[i],
             "' are not contiguous (they appear again in layer module '", L[i].name, "' after other layer modules)");
    seen[key[i]] = true;
    cuts.emplace_back(int64_t(i), int64_t(i) + 1);
    names->push_back(!matched[i] ? key[i].substr(1) : key[i].empty() ? std::string("(empty match)") : key[i]);
  }
  EG_CHECK(cuts.size() >= 2, "--freeze-module-regex '", re_text, "' makes a single unit of the whole model; ",
           "freezing needs at least two (the last is never frozen)");
  return cuts;
}

}  // namespace

Partition make_partition(const models::Model& m, PartitionMode mode, const std::string& regex) {
  std::vector<Layer> L;
  for (auto& [n, mod] : m.layer_modules()) L.push_back({n, stage_of(n), mod->num_parameters()});
  EG_CHECK(L.size() >= 2, "layer freezing needs a model with at least two layer modules");
  std::vector<std::pair<int64_t, int64_t>> cuts;
  if (!regex.empty()) {
    std::vector<std::string> names;
    cuts = regex_cuts(m, L, regex, &names);
    std::vector<FreezeUnit> u = finish(L, cuts);
    for (size_t i = 0; i < u.size(); ++i) u[i].name = names[i];
    return Partition(std::move(u));
  }
  if (mode == PartitionMode::layers) {
    for (int64_t i = 0; i < int64_t(L.size()); ++i) cuts.emplace_back(i, i + 1);
  } else {
    cuts = auto_cuts(L);
  }
  return Partition(finish(L, cuts));
}

}  // namespace eg::freeze
