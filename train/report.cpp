#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "freeze/tracker.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[4096];  // a line of the report; longer text is cut, never overrun
  va_list a;
  va_start(a, f);
  std::vsnprintf(buf, sizeof buf, f, a);
  va_end(a);
  return buf;
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec);
}

json read_json(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  if (!f) throw Error("egeria report: no " + what + " at '" + path + "'");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error("egeria report: '" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  if (!f) return out;  // a run without freezing has no freeze.jsonl
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception&) {
      throw Error("egeria report: line " + std::to_string(n) + " of '" + path + "' is not valid JSON");
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// What a run scored at the end, in the task's own terms.
std::string quality(const json& s) {
  if (s.contains("final_test_bleu"))
    return fmt("final test BLEU %.2f, test loss %.4f", s.value("final_test_bleu", 0.0),
               s.value("final_test_loss", 0.0));
  return fmt("final test accuracy %.2f%%", 100 * s.value("final_test_accuracy", 0.0));
}

struct Units {
  std::vector<std::string> names;
  std::vector<double> share;  // of the parameters in all units
  std::string prefix(int64_t k) const {
    std::string s;
    for (int64_t u = 0; u < k && u < int64_t(names.size()); ++u) s += (u ? ", " : "") + names[size_t(u)];
    return s.empty() ? "nothing" : s;
  }
  std::string list(const std::vector<int64_t>& set) const {
    std::string s;
    for (int64_t u : set) s += (s.empty() ? "" : ", ") + name(u);
    return s.empty() ? "nothing" : s;
  }
  std::string name(int64_t u) const {
    return u >= 0 && u < int64_t(names.size()) ? names[size_t(u)] : "unit " + std::to_string(u);
  }
  double prefix_share(int64_t k) const {
    double v = 0;
    for (int64_t u = 0; u < k && u < int64_t(share.size()); ++u) v += share[size_t(u)];
    return v;
  }
};

// Egeria's decisions, each with the readings behind it (freeze/tracker.h's events). `peak`:
// T was a share of the steepest slope so far, not of the first 3 (--freeze-tolerance-from).
void egeria_story(const std::vector<json>& log, const Units& units, double coef, bool peak, std::string& r) {
  const json* last_boot = nullptr;
  bool evaluated = false;
  for (auto& e : log) evaluated |= e.value("type", "") == "evaluation";
  int64_t prev_boot_step = 0;
  double lr_at_front_freeze = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    const json& e = log[i];
    const std::string type = e.value("type", "");
    const int64_t step = e.value("step", int64_t(0));
    const std::string at = fmt("- step %lld (epoch %lld): ", (long long)step, (long long)e.value("epoch", int64_t(0)));
    if (type == "bootstrap") {
      if (last_boot) prev_boot_step = last_boot->value("step", int64_t(0));
      last_boot = &e;
      // The check that ends bootstrapping is the last one, followed by evaluations.
      bool later_boot = false;
      for (size_t j = i + 1; j < log.size(); ++j) later_boot |= log[j].value("type", "") == "bootstrap";
      if (later_boot || !evaluated || !e.contains("prev_loss") || e["prev_loss"].is_null()) continue;
      const double loss = e.value("loss", 0.0), prev = e["prev_loss"].get<double>();
      r += at + fmt("bootstrapping over: the mean training loss of the %lld steps before, %.4f, changed by %.1f%% "
                    "from the span before (%.4f), under 10%%; the plasticity readings start\n",
                    (long long)(step - prev_boot_step), loss, 100 * std::abs(loss - prev) / prev, prev);
    } else if (type == "freeze" || type == "hold") {
      const int64_t m = e.value("module", int64_t(0)), w = e.value("window", int64_t(1));
      if (e.value("reason", "") == "held") {
        r += at + fmt("froze %s, held since the first LR phase (--freeze-first-phase off), now that the LR fell "
                      "to %g\n",
                      units.prefix(m + 1).c_str(), e.value("lr", 0.0));
        lr_at_front_freeze = e.value("lr", 0.0);
        continue;
      }
      // The W readings that froze it: the unit's last W evaluations up to here.
      std::vector<double> slopes;
      double tol = 0;
      int64_t first = step;
      for (size_t j = i; j-- > 0 && int64_t(slopes.size()) < w;) {
        const json& v = log[j];
        if (v.value("type", "") != "evaluation" || v.value("module", int64_t(-1)) != m) continue;
        if (!v.contains("slope") || !v.contains("tolerance") || v["slope"].is_null() || v["tolerance"].is_null()) break;
        slopes.push_back(std::abs(v["slope"].get<double>()));
        if (tol == 0) tol = v["tolerance"].get<double>();
        first = v.value("step", step);
      }
      const auto [lo, hi] = std::minmax_element(slopes.begin(), slopes.end());
      const std::string why =
          slopes.empty()
              ? std::string("its readings were stale W times in a row")
              : fmt("the slope of its smoothed plasticity stayed under its tolerance T = %.2e (%s the steepest "
                    "of its %s) for W = %lld readings in a row, steps %lld-%lld (|slope| %.2e to %.2e)",
                    tol, coef > 0 ? fmt("%g x", coef).c_str() : "a share of", peak ? "slopes so far" : "first 3 slopes",
                    (long long)w, (long long)first, (long long)step, *lo, *hi);
      if (type == "hold")
        r += at + "would freeze " + units.name(m) + ", held until the LR first falls 10x: " + why + "\n";
      else {
        r += at +
             fmt("froze %s (%.1f%% of the parameters frozen now): ", units.name(m).c_str(),
                 100 * units.prefix_share(m + 1)) +
             why + "\n";
        if (lr_at_front_freeze == 0) lr_at_front_freeze = e.value("lr", 0.0);
      }
    } else if (type == "unfreeze") {
      const std::string reason = e.value("reason", "");
      if (reason == "lr")
        r += at + fmt("unfroze everything: the LR fell to %g, 10x or more below its %g when the front unit froze; "
                      "W is %lld from here\n",
                      e.value("lr", 0.0), lr_at_front_freeze, (long long)e.value("window", int64_t(0)));
      else
        r += at + fmt("unfroze everything (%s) at LR %g; W is %lld from here\n", reason.c_str(), e.value("lr", 0.0),
                      (long long)e.value("window", int64_t(0)));
      lr_at_front_freeze = 0;
    }
  }
  if (last_boot && !evaluated)
    r += "- bootstrapping never ended: the training loss still changed by 10% or more between checks\n";
}

// The other policies' decisions: what froze when, and their criterion where they log one.
void other_story(const std::vector<json>& log, const Units& units, std::string& r) {
  for (size_t i = 0; i < log.size(); ++i) {
    const json& e = log[i];
    if (e.value("type", "") != "freeze") continue;
    const std::string at = fmt("- step %lld (epoch %lld): ", (long long)e.value("step", int64_t(0)),
                               (long long)e.value("epoch", int64_t(0)));
    if (e.contains("units")) {
      r += at + "frozen: " + units.list(e["units"].get<std::vector<int64_t>>()) + "\n";
    } else if (e.contains("modules")) {
      r += at + "frozen: " + units.prefix(e["modules"].get<int64_t>()) + "\n";
    } else {
      const int64_t m = e.value("module", int64_t(0));
      std::string why;
      if (i > 0 && log[i - 1].contains("grad_norm_change"))
        why =
            fmt(": its gradient norm changed by %.1f%% since the last evaluation, at or under the percentile "
                "cut %.1f%%",
                100 * log[i - 1].value("grad_norm_change", 0.0), 100 * log[i - 1].value("percentile_cut", 0.0));
      r += at + "froze " + units.name(m) + why + "\n";
    }
  }
}

// SmartFRZ's stages and what each froze, with the predictor's probabilities behind it.
void smartfrz_story(const std::vector<json>& log, const Units& units, double threshold, std::string& r) {
  int64_t stages = 0, held = 0;
  for (auto& e : log) {
    const std::string type = e.value("type", "");
    if (type == "stage") {
      ++stages;
      continue;
    }
    if (type == "held") {
      ++held;
      continue;
    }
    if (type == "start") {
      const std::string bound =
          fmt("%.3f (--smartfrz-start-below times %.3f, the loss of predicting the training "
              "targets' frequencies)",
              e.value("start_loss", 0.0), e.value("constant_loss", 0.0));
      const long long step = e.value("step", int64_t(0));
      const double loss = e.value("train_loss", 0.0);
      if (held > 0)
        r +=
            fmt("- held its first %lld freezing stages until step %lld: the mean training loss of a stage's steps "
                "was over %s; at step %lld it was %.3f\n",
                (long long)held, step, bound.c_str(), step, loss);
      else
        r += fmt("- its first freezing stage (step %lld) found the mean training loss at %.3f, under %s\n", step, loss,
                 bound.c_str());
      held = 0;
      continue;
    }
    if (type != "freeze" || !e.contains("froze")) continue;
    const auto froze = e["froze"].get<std::vector<int64_t>>();
    const auto p = e.value("p_freeze", std::vector<double>());
    const auto streak = e.value("streak", std::vector<int64_t>());
    std::string what;
    for (size_t i = 0; i < froze.size(); ++i) {
      what += fmt("%s%s (%.2f", i ? ", " : "", units.name(froze[i]).c_str(), i < p.size() ? p[i] : 0.0);
      if (i < streak.size() && streak[i] > 1) what += fmt(", named at %lld stages in a row", (long long)streak[i]);
      what += ")";
    }
    r +=
        fmt("- step %lld (epoch %lld): froze %s, P(freeze) at or over %.2f at the stage of step %lld; frozen: %s\n",
            (long long)e.value("step", int64_t(0)), (long long)e.value("epoch", int64_t(0)), what.c_str(), threshold,
            (long long)e.value("stage_step", int64_t(0)), units.list(e.value("units", std::vector<int64_t>())).c_str());
  }
  if (held > 0)
    r +=
        fmt("- held every freezing stage (%lld): the mean training loss of a stage's steps stayed over "
            "--smartfrz-start-below times the loss of predicting the training targets' frequencies\n",
            (long long)held);
  else if (stages == 0) r += "- no freezing stage found a full window\n";
  else r += fmt("- %lld freezing stages\n", (long long)stages);
}

// The frozen set a metrics line says: its frozen_units, or (a prefix) its number of front units.
std::vector<int64_t> frozen_set(const json& j) {
  if (j.contains("frozen_units")) return j["frozen_units"].get<std::vector<int64_t>>();
  std::vector<int64_t> s;
  for (int64_t u = 0; u < j.value("frozen_modules", int64_t(0)); ++u) s.push_back(u);
  return s;
}

using StepsBySet = std::map<std::vector<int64_t>, int64_t>;

// Median milliseconds a step took with each frozen set, from pairs of consecutive step
// lines within one epoch between which the frozen set did not change; and how many steps
// ran with each set.
void step_times(const std::vector<json>& metrics, int64_t total_steps,
                std::map<std::vector<int64_t>, std::vector<double>>& ms, StepsBySet& steps) {
  const json* prev = nullptr;
  std::vector<int64_t> k;
  int64_t from = 0;
  for (auto& j : metrics) {
    const std::string type = j.value("type", "");
    if (type == "freeze") {
      const int64_t s = j.value("step", int64_t(0));
      steps[k] += s - from;
      from = s, k = frozen_set(j);
      prev = nullptr;
    } else if (type == "step") {
      if (prev && prev->value("epoch", -1) == j.value("epoch", -2) && frozen_set(*prev) == frozen_set(j)) {
        const double dt = j.value("train_seconds", 0.0) - prev->value("train_seconds", 0.0);
        const int64_t ds = j.value("step", int64_t(0)) - prev->value("step", int64_t(0));
        if (ds > 0 && dt > 0) ms[frozen_set(j)].push_back(1000 * dt / double(ds));
      }
      prev = &j;
    } else if (type == "epoch") {
      prev = nullptr;
    }
  }
  steps[k] += total_steps - from;
}

// The step times of each frozen set, against nothing frozen, from the step lines, and
// what the frozen steps saved at those medians.
std::string step_time_text(const std::vector<json>& metrics, const json& s, const Units& units, int64_t steps_total) {
  std::string r;
  std::map<std::vector<int64_t>, std::vector<double>> ms;
  StepsBySet steps;
  step_times(metrics, steps_total, ms, steps);
  const std::vector<int64_t> none;
  if (ms.count(none)) {
    const double base = median(ms[none]);
    double saved = 0;
    bool timed = false;  // a frozen prefix's steps timed
    r += fmt("; a step took %.1f ms (median) with nothing frozen", base);
    for (auto& [k, v] : ms) {
      if (k.empty() || steps[k] <= 0) continue;
      timed = true;
      const double m = median(v);
      saved += double(steps[k]) * (base - m) / 1000;
      r += fmt(", %.1f ms with %s frozen (%lld steps, %.2fx)", m, units.list(k).c_str(), (long long)steps[k], base / m);
    }
    for (auto& [k, n] : steps)
      if (!k.empty() && n > 0 && !ms.count(k))
        r += fmt(", not measured with %s frozen (%lld steps, too few between log lines)", units.list(k).c_str(),
                 (long long)n);
    const double train = s.value("train_seconds", 0.0);
    // A frozen prefix timed slower than nothing frozen is said as such, not as a negative saving: its
    // steps ran at another time (the machine's speed drifts) or on other batches (a sequence model's
    // step time follows the batch's length), and the run's own times cannot tell which.
    if (timed && saved >= 0)
      r +=
          fmt("; at those medians the frozen steps took %.1f s less than unfrozen ones would have, %.1f%% of the "
              "%.1f s the run's steps would have taken",
              saved, train + saved > 0 ? 100 * saved / (train + saved) : 0.0, train + saved);
    else if (timed)
      r +=
          fmt("; at those medians the frozen steps took %.1f s more than unfrozen ones would have: they were "
              "timed slower, at another time or on other batches, so this run's own times show no saving",
              -saved);
  }
  return r;
}

// The line that sets a run beside another's summary (a run directory or a stored
// summary.json): its quality, and the speedup when both were timed on this machine.
std::string against_text(const json& s, const std::string& against) {
  std::string r;
  const int64_t steps_total = s.value("steps", int64_t(0));
  const std::string path = is_dir(against) ? against + "/summary.json" : against;
  const json b = read_json(path, "summary.json to compare with");
  r += fmt("  beside --freeze %s (%s", b.value("freeze", "?").c_str(), path.c_str());
  if (b.contains("measured")) r += ", " + b["measured"].get<std::string>();
  r += "): " + quality(b) + fmt(", %.1f s of training", b.value("train_seconds", 0.0));
  if (b.value("model", "") != s.value("model", "") || b.value("steps", int64_t(-1)) != steps_total)
    r += fmt(" (not the same run: %s, %lld steps)", b.value("model", "?").c_str(),
             (long long)b.value("steps", int64_t(0)));
  if (s.contains("final_test_accuracy") && b.contains("final_test_accuracy"))
    r += fmt(": %+.2f pt", 100 * (s.value("final_test_accuracy", 0.0) - b.value("final_test_accuracy", 0.0)));
  if (s.contains("final_test_bleu") && b.contains("final_test_bleu"))
    r += fmt(": BLEU %+.2f", s.value("final_test_bleu", 0.0) - b.value("final_test_bleu", 0.0));
  const double t = s.value("train_seconds", 0.0);
  // A stored measurement was timed at another moment, and a machine's speed drifts
  // between runs by more than a few frozen units save: no ratio is drawn from it.
  if (b.contains("measured"))
    r += "; its time was measured at another moment, so it is no gauge of the speedup (the step times above "
         "are this run's own)";
  else if (t > 0) r += fmt("; speedup in training time %.2fx", b.value("train_seconds", 0.0) / t);
  r += "\n";
  return r;
}

std::string report_text(const std::string& dir, const std::string& against) {
  const json s = read_json(dir + "/summary.json", "summary.json (the run has not finished)");
  EG_CHECK(s.is_object() && s.contains("model") && s.contains("steps"), "report: '", dir,
           "/summary.json' is not a summary egeria wrote (it has no \"model\" and \"steps\")");
  const json cfg = is_dir(dir) ? read_json(dir + "/config.json", "config.json") : json::object();
  const std::vector<json> metrics = read_lines(dir + "/metrics.jsonl"), log = read_lines(dir + "/freeze.jsonl");
  const std::string policy = s.value("freeze", "none");
  const int64_t steps_total = s.value("steps", int64_t(0));
  Units units;
  double all = 0;
  for (auto& u : s.value("freeze_units", json::array())) {
    units.names.push_back(u.value("name", "?"));
    units.share.push_back(u.value("params", 0.0));
    all += u.value("params", 0.0);
  }
  for (auto& v : units.share) v /= std::max(all, 1.0);

  std::string r = fmt("%s: %s on %s, %lld steps (%lld epochs), --freeze %s", dir.c_str(), s.value("model", "?").c_str(),
                      s.value("dataset", "?").c_str(), (long long)steps_total, (long long)s.value("epochs", int64_t(0)),
                      policy.c_str());
  if (!units.names.empty())
    r += fmt(", %zu freezing units (%s; the last is never frozen)", units.names.size(),
             units.prefix(int64_t(units.names.size())).c_str());
  r += "\n";
  if (policy != "none") {
    const json st = s.value("freeze_stats", json::object());
    if (policy == "egeria") {
      const bool no_boot = st.value("bootstrap_interval", int64_t(0)) == freeze::kNoBootstrapping;
      r +=
          fmt("What froze and why (plasticity read every n = %lld steps %s%s; a unit freezes when W readings in a "
              "row find the slope of its smoothed plasticity under its tolerance T):\n",
              (long long)st.value("interval", int64_t(0)),
              no_boot ? "from the first step, without bootstrapping (a pretrained network: --init-from)"
                      : "once bootstrapping ended",
              st.value("reference_bn", "") == "batch"
                  ? ", against a reference whose batch norms take each batch's statistics"
                  : "");
      if (cfg.value("freeze_reading", "") == "per-lr2")
        r += "(Each reading is the plasticity divided by the sum of the squared LRs of the updates since the "
             "reference, --freeze-reading per-lr2: the slopes and T below are of those.)\n";
      egeria_story(log, units, cfg.value("freeze_tolerance", 0.0),
                   st.value("tolerance_from", cfg.value("freeze_tolerance_from", "")) == "peak", r);
    } else if (policy == "smartfrz") {
      r +=
          fmt("What froze and why (predictor %s; a stage reads each active unit's last %lld records of %lld "
              "weights, one every %lld steps; a stage every %lld steps; order %s):\n",
              st.value("predictor", "?").c_str(), (long long)st.value("window", int64_t(0)),
              (long long)st.value("tailor", int64_t(0)), (long long)st.value("record_every", int64_t(0)),
              (long long)st.value("stage_every", int64_t(0)), st.value("order", "?").c_str());
      smartfrz_story(log, units, st.value("threshold", 0.5), r);
    } else {
      r += "What froze:\n";
      other_story(log, units, r);
    }
    std::vector<int64_t> fin_set = s.contains("frozen_units_final")
                                       ? s["frozen_units_final"].get<std::vector<int64_t>>()
                                       : frozen_set({{"frozen_modules", s.value("frozen_modules_final", int64_t(0))}});
    const int64_t fin = int64_t(fin_set.size());
    r += fmt("- frozen at the end: %s", units.list(fin_set).c_str());
    if (fin > 0)
      r += fmt(" (%lld of %zu units, %.1f%% of the parameters)", (long long)fin, units.names.size() - 1,
               100 * s.value("frozen_fraction_final", 0.0));
    r += "\n";

    r += fmt("What it saved: %.1f%% of the backward FLOPs over the run",
             100 * s.value("backward_flops_saved_fraction", 0.0));
    r += step_time_text(metrics, s, units, steps_total);
    if (st.contains("reference"))
      r += fmt("; the reference model (%s) cost %.1f%% of the training time", st.value("reference", "?").c_str(),
               100 * s.value("reference_overhead_fraction", 0.0));
    if (policy == "smartfrz")
      r += fmt("; its recording and predictor cost %.1f%% of the training time",
               100 * s.value("reference_overhead_fraction", 0.0));
    r += "\n";
  }

  r += "Accuracy: " + quality(s) + fmt(", %.1f s of training", s.value("train_seconds", 0.0)) + "\n";
  if (!against.empty()) r += against_text(s, against);
  return r;
}

}  // namespace

std::string run_report(const std::string& dir, const std::string& against) {
  try {
    return report_text(dir, against);
  } catch (const json::exception& e) {  // a field of the wrong type: a file edited by hand, or another program's
    EG_THROW("report: a field in the files of '", dir, "' (summary.json, config.json, the logs)",
             against.empty() ? "" : " or of '" + against + "'", " is not what egeria writes there: ", e.what());
  }
}

}  // namespace eg::train
