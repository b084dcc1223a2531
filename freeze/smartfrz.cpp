#include "freeze/smartfrz.h"

#include <cmath>
#include <set>

#include "autograd/node.h"
#include "core/error.h"

namespace eg::freeze {

namespace {

std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t hidden, int64_t out, Generator& g) {
  auto s = std::make_shared<nn::Sequential>();
  s->add(std::make_shared<nn::Linear>(in, hidden, true, g));
  s->add(nn::ReLU());
  s->add(std::make_shared<nn::Linear>(hidden, hidden, true, g));
  s->add(nn::ReLU());
  s->add(std::make_shared<nn::Linear>(hidden, out, true, g));
  return s;
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& file) {
  auto it = meta.find(key);
  EG_CHECK(it != meta.end(), "SmartFRZ predictor ", file, ": its metadata has no '", key,
           "' (not a predictor written by egeria?)");
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    EG_CHECK(used == it->second.size() && v > 0, "");
    return v;
  } catch (const std::exception&) {
    EG_THROW("SmartFRZ predictor ", file, ": metadata '", key, "' is '", it->second, "', not a positive integer");
  }
}

}  // namespace

const char* smartfrz_input_name(SmartFrzInput i) {
  return i == SmartFrzInput::movement ? "movement" : "movement-per-lr";
}

std::optional<SmartFrzInput> find_smartfrz_input(const std::string& name) {
  if (name == "movement") return SmartFrzInput::movement;
  if (name == "movement-per-lr") return SmartFrzInput::movement_per_lr;
  return std::nullopt;
}

SmartFrzInput parse_smartfrz_input(const std::string& name) {
  const auto i = find_smartfrz_input(name);
  EG_CHECK(i, "SmartFRZ predictor input '", name, "' is not one of movement, movement-per-lr");
  return *i;
}

std::map<std::string, std::string> SmartFrzGeometry::to_metadata() const {
  char gain_text[64];
  std::snprintf(gain_text, sizeof gain_text, "%.17g", gain);
  std::map<std::string, std::string> m = {
      {"format", kSmartFrzFormat},  {"tailor", std::to_string(tailor)}, {"hidden", std::to_string(hidden)},
      {"dim", std::to_string(dim)}, {"head", std::to_string(head)},     {"window", std::to_string(window)},
      {"gain", gain_text}};
  if (input != SmartFrzInput::movement) {
    m["format"] = kSmartFrzFormat2;
    m["input"] = smartfrz_input_name(input);
  }
  return m;
}

SmartFrzGeometry SmartFrzGeometry::from_metadata(const std::map<std::string, std::string>& meta,
                                                 const std::string& file) {
  auto f = meta.find("format");
  const bool v2 = f != meta.end() && f->second == kSmartFrzFormat2;
  EG_CHECK(f != meta.end() && (f->second == kSmartFrzFormat || v2), "SmartFRZ predictor ", file,
           ": not a predictor file (",
           f == meta.end() ? std::string("no 'format' in its metadata") : "format '" + f->second + "'", ", expected '",
           kSmartFrzFormat, "' or '", kSmartFrzFormat2, "')");
  SmartFrzGeometry g;
  if (v2) {
    auto in = meta.find("input");
    EG_CHECK(in != meta.end(), "SmartFRZ predictor ", file, ": format 2 and its metadata has no 'input'");
    const auto input = find_smartfrz_input(in->second);
    EG_CHECK(input, "SmartFRZ predictor ", file, ": its input '", in->second,
             "' is not one of movement, movement-per-lr (written by a newer egeria?)");
    g.input = *input;
  }
  g.tailor = meta_int(meta, "tailor", file);
  g.hidden = meta_int(meta, "hidden", file);
  g.dim = meta_int(meta, "dim", file);
  g.head = meta_int(meta, "head", file);
  g.window = meta_int(meta, "window", file);
  EG_CHECK(g.window >= 2, "SmartFRZ predictor ", file, ": window ", g.window, " (at least 2: a query and a key)");
  auto it = meta.find("gain");
  EG_CHECK(it != meta.end(), "SmartFRZ predictor ", file, ": its metadata has no 'gain'");
  char* end = nullptr;
  g.gain = std::strtod(it->second.c_str(), &end);
  EG_CHECK(end && *end == '\0' && std::isfinite(g.gain) && g.gain > 0, "SmartFRZ predictor ", file,
           ": metadata 'gain' is '", it->second, "', not a positive number");
  return g;
}

SmartFrzPredictor::SmartFrzPredictor(const SmartFrzGeometry& g, Generator& gen) : g_(g) {
  EG_CHECK(g.tailor > 0 && g.hidden > 0 && g.dim > 0 && g.head > 0, "SmartFRZ predictor: sizes must be positive");
  query_ = register_module("query", mlp(g.tailor, g.hidden, g.dim, gen));
  key_ = register_module("key", mlp(g.tailor, g.hidden, g.dim, gen));
  value_ = register_module("value", mlp(g.tailor, g.hidden, g.dim, gen));
  head_ = register_module("head", mlp(g.dim, g.head, 2, gen));
}

Tensor SmartFrzPredictor::forward(const Tensor& w) {
  EG_CHECK(w.dim() == 3 && w.size(1) >= 2 && w.size(2) == g_.tailor,
           "SmartFRZ predictor: expected windows [B, M >= 2, ", g_.tailor, "], got ", shape_str(w.shape()));
  const int64_t b = w.size(0), m = w.size(1);
  // The newest row of each window, and the older ones: copies (slices along dim 1 are not views).
  std::vector<float> all = w.to_vector<float>();
  std::vector<float> newest(size_t(b * g_.tailor)), older(size_t(b * (m - 1) * g_.tailor));
  for (int64_t i = 0; i < b; ++i) {
    const float* src = all.data() + i * m * g_.tailor;
    std::copy(src + (m - 1) * g_.tailor, src + m * g_.tailor, newest.begin() + i * g_.tailor);
    std::copy(src, src + (m - 1) * g_.tailor, older.begin() + i * (m - 1) * g_.tailor);
  }
  const Device d = device();
  const Tensor q = query_->forward(Tensor::from_vector(newest, {b, 1, g_.tailor}, d));  // [B, 1, dim]
  const Tensor old = Tensor::from_vector(older, {b, m - 1, g_.tailor}, d);
  const Tensor k = key_->forward(old), v = value_->forward(old);  // [B, M-1, dim]
  const Tensor scores = fn::scale(fn::matmul(q, k, false, true), 1.0 / std::sqrt(double(g_.dim)));  // [B, 1, M-1]
  const Tensor ctx = fn::matmul(fn::softmax(scores), v);  // [B, 1, dim]
  return fn::reshape(head_->forward(ctx), {b, 2});
}

std::vector<double> SmartFrzPredictor::freeze_probability(const Tensor& windows) {
  autograd::NoGradGuard ng;
  const std::vector<float> p = fn::softmax(forward(windows)).to(Device::cpu()).to_vector<float>();
  std::vector<double> r;
  for (size_t i = 1; i < p.size(); i += 2) r.push_back(double(p[i]));
  return r;
}

void SmartFrzPredictor::load(const std::map<std::string, Tensor>& weights, const std::string& file) {
  const auto own = state_dict();
  std::string missing, unexpected, shapes;
  for (auto& [k, t] : own) {
    auto it = weights.find(k);
    if (it == weights.end()) missing += (missing.empty() ? "" : ", ") + k;
    else if (it->second.shape() != t.shape())
      shapes += (shapes.empty() ? "" : ", ") + k + " " + shape_str(it->second.shape()) + " (expected " +
                shape_str(t.shape()) + ")";
  }
  for (auto& [k, t] : weights)
    if (!own.count(k)) unexpected += (unexpected.empty() ? "" : ", ") + k;
  EG_CHECK(missing.empty() && unexpected.empty() && shapes.empty(), "SmartFRZ predictor ", file,
           " does not fit its metadata's shape (tailor ", g_.tailor, ", hidden ", g_.hidden, ", dim ", g_.dim,
           ", head ", g_.head, ")", missing.empty() ? "" : "; missing: " + missing,
           unexpected.empty() ? "" : "; unexpected: " + unexpected,
           shapes.empty() ? "" : "; of another shape: " + shapes);
  for (auto& [k, t] : weights) EG_CHECK(t.dtype() == DType::f32, "SmartFRZ predictor ", file, ": ", k, " is not f32");
  load_state_dict(weights, true);
}

Tensor smartfrz_features(const Tensor& records, double gain, const std::vector<float>& lrs) {
  EG_CHECK(records.dim() == 2 && records.size(0) >= 2, "smartfrz_features: expected records [M >= 2, T], got ",
           shape_str(records.shape()));
  const int64_t m = records.size(0), t = records.size(1);
  EG_CHECK(lrs.empty() || int64_t(lrs.size()) == m, "smartfrz_features: ", lrs.size(), " learning rates for ", m,
           " records");
  const std::vector<float> r = records.to_vector<float>();
  double ss = 0;
  for (int64_t j = 0; j < t; ++j) ss += double(r[size_t((m - 1) * t + j)]) * r[size_t((m - 1) * t + j)];
  const double rms = std::sqrt(ss / double(t));
  const double s = rms > 0 ? gain / rms : 0.0;  // all-zero weights: no movement to read
  std::vector<float> out(r.size());
  std::vector<double> path(static_cast<size_t>(m));
  for (int64_t j = 0; j < t; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const double w = r[size_t(i * t + j)];
      if (lrs.empty() || i == 0) {
        path[size_t(i)] = w;
      } else {
        const double step = w - double(r[size_t((i - 1) * t + j)]), lr = lrs[size_t(i)];
        path[size_t(i)] = path[size_t(i - 1)] + (lr > 0 ? step / lr : 0.0);
      }
    }
    double mean = 0;
    for (double v : path) mean += v;
    mean /= double(m);
    for (int64_t i = 0; i < m; ++i) out[size_t(i * t + j)] = float((path[size_t(i)] - mean) * s);
  }
  return Tensor::from_vector(out, {m, t});
}

std::vector<TailorPosition> tailor_positions(const std::vector<int64_t>& numels, int64_t tailor, uint64_t seed,
                                             int64_t unit) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  EG_CHECK(total > 0 && tailor > 0, "tailor_positions: a unit with no weights to record");
  // Philox keyed by the run's seed and the unit, counter by draw: the same positions on
  // every machine and after a resume.
  const uint64_t key = seed * 0x9E3779B97F4A7C15ull + uint64_t(unit) * 0xD1B54A32D192ED03ull + 0x5A17F2;
  std::vector<int64_t> flat;
  std::set<int64_t> taken;
  for (uint64_t c = 0; int64_t(flat.size()) < tailor; ++c) {
    const Philox4 r = philox4x32(key, c);
    const int64_t i = int64_t(((uint64_t(r.x[0]) << 32) | r.x[1]) % uint64_t(total));
    if (total >= tailor && !taken.insert(i).second) continue;  // without replacement where there are enough
    flat.push_back(i);
  }
  std::vector<TailorPosition> out;
  for (int64_t i : flat) {
    int64_t p = 0, off = i;
    while (off >= numels[size_t(p)]) off -= numels[size_t(p)], ++p;
    out.push_back({p, off});
  }
  return out;
}

TailoredWeights::TailoredWeights(models::Model& m, const Partition& part, int64_t tailor, uint64_t seed)
    : tailor_(tailor) {
  const auto layers = m.layer_modules();
  units_.resize(size_t(part.size()));
  for (int64_t u = 0; u < part.size(); ++u) {
    const FreezeUnit& fu = part.units()[size_t(u)];
    std::vector<Tensor> params, all;
    for (int64_t l = fu.begin; l < fu.end; ++l)
      for (auto& p : layers[size_t(l)].second->parameters()) {
        all.push_back(p);
        if (p.dim() >= 2) params.push_back(p);
      }
    if (params.empty()) params = all;
    if (params.empty()) continue;
    std::vector<int64_t> numels;
    for (auto& p : params) numels.push_back(p.numel());
    const auto pos = tailor_positions(numels, tailor, seed, u);
    Unit& r = units_[size_t(u)];
    r.params = params;
    r.ids.resize(params.size());
    r.slots.resize(params.size());
    std::vector<std::vector<int64_t>> offsets(params.size());
    for (size_t i = 0; i < pos.size(); ++i) {
      offsets[size_t(pos[i].param)].push_back(pos[i].offset);
      r.slots[size_t(pos[i].param)].push_back(int64_t(i));
    }
    for (size_t j = 0; j < params.size(); ++j)
      if (!offsets[j].empty())
        r.ids[j] = Tensor::from_vector(offsets[j], {int64_t(offsets[j].size())}, params[j].device());
  }
}

std::vector<float> TailoredWeights::read(int64_t unit) const {
  autograd::NoGradGuard ng;
  const Unit& r = units_.at(size_t(unit));
  std::vector<float> row(static_cast<size_t>(tailor_));
  for (size_t j = 0; j < r.params.size(); ++j) {
    if (!r.ids[j].defined()) continue;
    const Tensor& p = r.params[j];
    Tensor v = fn::embedding(r.ids[j], fn::reshape(p, {p.numel(), 1})).to(Device::cpu());
    if (v.dtype() != DType::f32) v = v.to(DType::f32);
    const std::vector<float> vals = v.to_vector<float>();
    for (size_t i = 0; i < vals.size(); ++i) row[size_t(r.slots[j][i])] = vals[i];
  }
  return row;
}

}  // namespace eg::freeze
