#include "train/smartfrz_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "autograd/node.h"
#include "core/error.h"
#include "optim/optimizer.h"
#include "train/safetensors.h"
#include "train/smartfrz_record.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

struct Run {
  std::string file, model;
  bool pretrained = false;
  int64_t records = 0, tailor = 0;
  std::vector<std::string> units;
  std::vector<std::vector<float>> weights;  // a unit each: records x tailor
  std::vector<float> lrs;  // a record each; empty in files of an egeria before they were recorded
  std::vector<std::vector<double>> cka;  // a unit each: a value per record
  std::vector<int64_t> freeze_from;  // a unit each: its first "freeze" record (records: never)
};

struct Sample {
  size_t run, unit;
  int64_t t;
  int64_t label;
};

int64_t meta_number(const Metadata& m, const std::string& key, const std::string& file) {
  auto it = m.find(key);
  EG_CHECK(it != m.end(), "smartfrz-train: ", file, " has no '", key, "' in its metadata");
  return std::stoll(it->second);
}

Run read_run(const std::string& file, double tolerance) {
  Metadata meta;
  const TensorMap t = load_safetensors(file, &meta);
  EG_CHECK(meta.count("format") && meta.at("format") == kSmartFrzRecordsFormat, "smartfrz-train: ", file,
           " is not a records file of --smartfrz-record on (format '", meta.count("format") ? meta.at("format") : "",
           "')");
  Run r;
  r.file = file;
  r.model = meta.count("model") ? meta.at("model") : "?";
  r.pretrained = meta.count("init_from") && !meta.at("init_from").empty();
  r.tailor = meta_number(meta, "tailor", file);
  r.units = json::parse(meta.at("units")).get<std::vector<std::string>>();
  EG_CHECK(t.count("steps"), "smartfrz-train: ", file, " holds no records (a run shorter than its record interval?)");
  r.records = t.at("steps").size(0);
  if (t.count("lrs")) {
    r.lrs = t.at("lrs").to_vector<float>();
    EG_CHECK(int64_t(r.lrs.size()) == r.records, "smartfrz-train: ", file, ": ", r.lrs.size(), " learning rates for ",
             r.records, " records");
  }
  for (size_t u = 0; u < r.units.size(); ++u) {
    const Tensor& w = t.at("weights/" + std::to_string(u));
    const Tensor& g = t.at("grams/" + std::to_string(u));
    EG_CHECK(w.dim() == 2 && w.size(0) == r.records && w.size(1) == r.tailor && g.dim() == 3 &&
                 g.size(0) == r.records && g.size(1) == g.size(2),
             "smartfrz-train: ", file, ": unit ", u, "'s records are malformed");
    r.weights.push_back(w.to_vector<float>());
    const std::vector<float> gv = g.to_vector<float>();
    const int64_t n = g.size(1);
    const auto gram = [&](int64_t i) {
      return std::vector<float>(gv.begin() + i * n * n, gv.begin() + (i + 1) * n * n);
    };
    const std::vector<float> last = gram(r.records - 1);
    std::vector<double> c;
    for (int64_t i = 0; i < r.records; ++i) c.push_back(linear_cka(gram(i), last, n));
    int64_t from = r.records;  // Note [SmartFRZ's labels]
    while (from > 0 && c[size_t(from - 1)] >= 1 - tolerance) --from;
    r.cka.push_back(std::move(c));
    r.freeze_from.push_back(from);
  }
  return r;
}

// How a sample's window becomes the predictor's input.
struct Features {
  int64_t window;
  double gain;
  freeze::SmartFrzInput input;
};

Tensor window_features(const Run& r, const Sample& s, const Features& f) {
  const int64_t t = r.tailor, first = s.t - f.window + 1;
  const std::vector<float>& w = r.weights[s.unit];
  std::vector<float> rows(w.begin() + first * t, w.begin() + (s.t + 1) * t), lrs;
  if (f.input == freeze::SmartFrzInput::movement_per_lr) lrs.assign(r.lrs.begin() + first, r.lrs.begin() + s.t + 1);
  return freeze::smartfrz_features(Tensor::from_vector(rows, {f.window, t}), f.gain, lrs);
}

Tensor batch_of(const std::vector<Run>& runs, const std::vector<Sample>& s, size_t begin, size_t end, const Features& f,
                Tensor* labels) {
  const int64_t t = runs[s[begin].run].tailor, b = int64_t(end - begin);
  std::vector<float> all;
  all.reserve(size_t(b * f.window * t));
  std::vector<int64_t> y;
  for (size_t i = begin; i < end; ++i) {
    const std::vector<float> v = window_features(runs[s[i].run], s[i], f).to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
    y.push_back(s[i].label);
  }
  if (labels) *labels = Tensor::from_vector(y, {b});
  return Tensor::from_vector(all, {b, f.window, t});
}

// Precision and recall of "freeze" at P >= 0.5 and at stricter thresholds
// (--smartfrz-threshold: a false freeze costs accuracy, a missed one only time).
json scores(freeze::SmartFrzPredictor& p, const std::vector<Run>& runs, const std::vector<Sample>& s, const Features& f,
            int64_t batch) {
  static const double kThresholds[] = {0.5, 0.7, 0.8, 0.9, 0.95, 0.99};
  std::vector<double> prob;
  for (size_t i = 0; i < s.size(); i += size_t(batch)) {
    const size_t end = std::min(s.size(), i + size_t(batch));
    const auto pb = p.freeze_probability(batch_of(runs, s, i, end, f, nullptr));
    prob.insert(prob.end(), pb.begin(), pb.end());
  }
  auto at = [&](double thr) {
    int64_t tp = 0, fp = 0, fn = 0, tn = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      const bool say = prob[j] >= thr, is = s[j].label == 1;
      tp += say && is, fp += say && !is, fn += !say && is, tn += !say && !is;
    }
    return json{{"threshold", thr},
                {"true_positives", tp},
                {"false_positives", fp},
                {"false_negatives", fn},
                {"true_negatives", tn},
                {"precision", tp + fp > 0 ? json(double(tp) / double(tp + fp)) : json(nullptr)},
                {"recall", tp + fn > 0 ? json(double(tp) / double(tp + fn)) : json(nullptr)}};
  };
  json r = at(0.5);
  int64_t positives = 0;
  for (auto& x : s) positives += x.label;
  r["samples"] = int64_t(s.size());
  r["positives"] = positives;
  json by = json::array();
  for (double t : kThresholds) by.push_back(at(t));
  r["by_threshold"] = by;
  return r;
}

// Trains p on `train` (shuffled every epoch from o.seed) with AdamW and cross-entropy;
// the mean loss of each epoch.
json fit(freeze::SmartFrzPredictor& p, const std::vector<Run>& runs, std::vector<Sample> train,
         const SmartFrzTrainOptions& o, const Features& f) {
  p.train();
  optim::AdamW opt(p.parameters(), o.lr);
  std::mt19937_64 shuffle(o.seed);
  json history = json::array();
  for (int64_t e = 0; e < o.epochs; ++e) {
    std::shuffle(train.begin(), train.end(), shuffle);
    double loss_sum = 0;
    int64_t batches = 0;
    for (size_t i = 0; i < train.size(); i += size_t(o.batch_size)) {
      const size_t end = std::min(train.size(), i + size_t(o.batch_size));
      Tensor y;
      const Tensor x = batch_of(runs, train, i, end, f, &y);
      opt.zero_grad();
      const Tensor loss = fn::cross_entropy(p.forward(x), y);
      autograd::backward({loss});
      if (o.grad_clip > 0) opt.clip_grad_norm(o.grad_clip);
      opt.step();
      loss_sum += loss.item();
      ++batches;
    }
    const double mean = loss_sum / double(std::max<int64_t>(1, batches));
    history.push_back({{"epoch", e + 1}, {"loss", mean}});
    std::printf("smartfrz-train: epoch %lld/%lld, loss %.4f\n", (long long)e + 1, (long long)o.epochs, mean);
    std::fflush(stdout);
  }
  return history;
}

}  // namespace

double linear_cka(const std::vector<float>& k, const std::vector<float>& l, int64_t n) {
  // Centring: HKH = K - row means - column means + grand mean.
  auto centred = [n](const std::vector<float>& g) {
    std::vector<double> row(size_t(n), 0.0), c(size_t(n * n));
    double all = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) row[size_t(i)] += g[size_t(i * n + j)];
    for (auto& v : row) all += v, v /= double(n);
    all /= double(n * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[size_t(i * n + j)] = g[size_t(i * n + j)] - row[size_t(i)] - row[size_t(j)] + all;
    return c;
  };
  const std::vector<double> a = centred(k), b = centred(l);
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

json train_smartfrz_predictor(const SmartFrzTrainOptions& o) {
  EG_CHECK(!o.records.empty(), "smartfrz-train: no records files given (--records)");
  EG_CHECK(o.window >= 2, "smartfrz-train: --window must be at least 2, got ", o.window);
  std::vector<Run> runs;
  for (auto& f : o.records) runs.push_back(read_run(f, o.cka_tolerance));
  const int64_t tailor = runs[0].tailor;
  std::vector<Sample> train, held;
  json runs_json = json::array();
  for (size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    EG_CHECK(run.tailor == tailor, "smartfrz-train: ", run.file, " records ", run.tailor, " weights per unit, ",
             runs[0].file, " ", tailor);
    EG_CHECK(run.records >= o.window, "smartfrz-train: ", run.file, " has ", run.records,
             " records, fewer than a window (", o.window, ")");
    EG_CHECK(o.geometry.input == freeze::SmartFrzInput::movement || !run.lrs.empty(), "smartfrz-train: ", run.file,
             " holds no learning rates (recorded by an egeria before they were), and --input movement-per-lr needs "
             "them: record the run again");
    const bool out = !o.hold_out.empty() && run.model == o.hold_out;
    int64_t pos = 0, n = 0;
    for (size_t u = 0; u < run.units.size(); ++u)
      for (int64_t t = o.window - 1; t < run.records; t += o.stride) {
        const Sample s{r, u, t, t >= run.freeze_from[u] ? 1 : 0};
        (out ? held : train).push_back(s);
        pos += s.label, ++n;
      }
    json units = json::array();
    for (size_t u = 0; u < run.units.size(); ++u) {
      json curve = json::array();
      for (double c : run.cka[u]) curve.push_back(std::round(c * 1e4) / 1e4);
      units.push_back({{"name", run.units[u]}, {"freeze_from_record", run.freeze_from[u]}, {"cka", curve}});
    }
    runs_json.push_back({{"file", run.file},
                         {"model", run.model},
                         {"pretrained", run.pretrained},
                         {"records", run.records},
                         {"held_out", out},
                         {"samples", n},
                         {"positive_share", n ? double(pos) / double(n) : 0.0},
                         {"units", units}});
  }
  EG_CHECK(!train.empty(), "smartfrz-train: every run is held out (--hold-out ", o.hold_out, ")");
  EG_CHECK(o.hold_out.empty() || !held.empty(), "smartfrz-train: no run of model '", o.hold_out, "' to hold out");

  // gain: the training features' RMS brought to 1 (Note [SmartFRZ's labels]).
  double ss = 0;
  int64_t cnt = 0;
  for (size_t i = 0; i < train.size(); i += std::max<size_t>(1, train.size() / 256)) {
    for (float v : window_features(runs[train[i].run], train[i], {o.window, 1.0, o.geometry.input}).to_vector<float>())
      ss += double(v) * v, ++cnt;
  }
  const double rms = cnt ? std::sqrt(ss / double(cnt)) : 0.0;
  freeze::SmartFrzGeometry g = o.geometry;
  g.tailor = tailor;
  g.window = o.window;
  g.gain = rms > 0 ? 1.0 / rms : 1.0;
  const Features f{o.window, g.gain, g.input};

  Generator gen(o.seed);
  freeze::SmartFrzPredictor p(g, gen);
  const auto t0 = std::chrono::steady_clock::now();
  const json history = fit(p, runs, train, o, f);
  p.eval();
  json r = {{"train", scores(p, runs, train, f, o.batch_size)},
            {"history", history},
            {"train_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
            {"gain", g.gain},
            {"input", freeze::smartfrz_input_name(g.input)},
            {"window", o.window},
            {"tailor", tailor},
            {"cka_tolerance", o.cka_tolerance},
            {"stride", o.stride},
            {"epochs", o.epochs},
            {"parameters", p.num_parameters()},
            {"runs", runs_json}};
  if (!held.empty()) r["held_out"] = {{"model", o.hold_out}, {"scores", scores(p, runs, held, f, o.batch_size)}};
  if (!o.out.empty()) {
    auto meta = g.to_metadata();
    json from = json::array();
    for (auto& run : runs)
      if (o.hold_out.empty() || run.model != o.hold_out)
        from.push_back(run.model + (run.pretrained ? " (fine-tuned)" : ""));
    meta["trained_on"] = from.dump();
    meta["cka_tolerance"] = std::to_string(o.cka_tolerance);
    save_safetensors(o.out, p.state_dict(), meta);
  }
  return r;
}

}  // namespace eg::train
