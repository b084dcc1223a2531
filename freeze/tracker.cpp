#include "freeze/tracker.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace eg::freeze {

using json = nlohmann::json;

int64_t default_interval(int64_t total, int64_t modules, int64_t window, bool pretrained) {
  EG_CHECK(total > 0 && modules > 0 && window > 0, "default_interval: iterations, modules and window must be positive");
  return std::max<int64_t>(pretrained ? kMinPretrainedInterval : kMinDefaultInterval,
                           int64_t(double(total) / double(2 * window) / double(modules) / 1.75));
}

int64_t default_bootstrap_interval(int64_t total, int64_t steps_per_epoch, int64_t interval) {
  EG_CHECK(total > 0 && interval > 0, "default_bootstrap_interval: iterations and n must be positive");
  const int64_t epoch = steps_per_epoch > 0 ? steps_per_epoch : total;
  return std::max(interval, std::min(epoch, total / 10));
}

double fit_slope(const std::vector<double>& ys) {
  const size_t n = ys.size();
  if (n < 2) return 0;
  const double xm = double(n - 1) / 2;
  double ym = 0;
  for (double y : ys) ym += y;
  ym /= double(n);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(i) - xm) * (ys[i] - ym);
    den += (double(i) - xm) * (double(i) - xm);
  }
  return num / den;
}

const char* decision_name(Decision d) {
  switch (d) {
    case Decision::none: return "none";
    case Decision::end_bootstrap: return "end_bootstrap";
    case Decision::freeze: return "freeze";
    case Decision::unfreeze_all: return "unfreeze_all";
  }
  return "?";
}

json Event::to_json() const {
  json j = {{"type", type}, {"step", step}, {"lr", lr}};
  if (type == "bootstrap") {
    j["loss"] = loss;
    j["prev_loss"] = prev_loss < 0 ? json(nullptr) : json(prev_loss);
  } else {
    j["module"] = module;
    j["counter"] = counter;
    j["window"] = window;
  }
  if (!reason.empty()) j["reason"] = reason;
  if (type == "evaluation") {
    j["plasticity"] = plasticity;
    if (lr_sq > 0) {
      j["lr_sq"] = lr_sq;
      j["reading"] = plasticity / lr_sq;
    }
    j["smoothed"] = smoothed;
    j["slope"] = has_slope ? json(slope) : json(nullptr);
    j["tolerance"] = tolerance > 0 ? json(tolerance) : json(nullptr);
  }
  return j;
}

FreezeTracker::FreezeTracker(int64_t num_modules, TrackerOptions o) : opt_(o), num_modules_(num_modules) {
  EG_CHECK(num_modules >= 2, "layer freezing needs at least two layer modules (the last is never frozen), got ",
           num_modules);
  EG_CHECK(o.window >= 1, "the freezing window W must be at least 1, got ", o.window);
  EG_CHECK(o.min_window >= 1, "the freezing window's floor must be at least 1, got ", o.min_window);
  EG_CHECK(o.tolerance_coef > 0, "the tolerance coefficient must be positive, got ", o.tolerance_coef);
  EG_CHECK(o.bootstrap_change > 0, "the bootstrapping change threshold must be positive, got ", o.bootstrap_change);
  EG_CHECK(o.unfreeze_lr_factor > 1, "the unfreezing LR factor must be above 1, got ", o.unfreeze_lr_factor);
  EG_CHECK(o.freeze_last_phase || o.final_lr >= 0,
           "not freezing in the last LR phase needs the run's final LR (TrackerOptions::final_lr)");
  EG_CHECK(o.bootstrap_interval >= kNoBootstrapping, "the bootstrapping interval must be auto (0), n (-1), none (-2) ",
           "or a positive number of iterations, got ", o.bootstrap_interval);
  window_ = o.window;
  kept_.resize(size_t(num_modules));
  bootstrapping_ = o.bootstrap_interval != kNoBootstrapping;
}

Event FreezeTracker::event(const char* type, int64_t step, double lr) const {
  Event e;
  e.type = type;
  e.step = step;
  e.module = front_;
  e.counter = cur_.counter;
  e.window = window_;
  e.lr = lr;
  return e;
}

json FreezeTracker::Readings::to_json() const {
  return {{"raw", raw},
          {"smoothed", smoothed},
          {"first_slopes", first_slopes},
          {"peak_slope", peak_slope},
          {"tolerance_lr", tolerance_lr},
          {"counter", counter}};
}

FreezeTracker::Readings FreezeTracker::Readings::from_json(const json& j) {
  Readings r;
  r.raw = j.at("raw").get<std::vector<double>>();
  r.smoothed = j.at("smoothed").get<std::vector<double>>();
  r.first_slopes = j.at("first_slopes").get<std::vector<double>>();
  r.peak_slope = j.value("peak_slope", 0.0);  // absent in checkpoints from before the option
  r.tolerance_lr = j.value("tolerance_lr", 0.0);  // likewise (remeasure: unused)
  r.counter = j.at("counter").get<int64_t>();
  return r;
}

void FreezeTracker::leave_module() {
  auto keep = [&](int64_t m, const Readings& r) {
    if (r.first_slopes.size() == 3) kept_[size_t(m)] = {r.first_slopes, r.peak_slope, r.tolerance_lr};
  };
  keep(front_, cur_);
  for (size_t i = 0; i < ahead_.size(); ++i) keep(front_ + 1 + int64_t(i), ahead_[i]);
}

FreezeTracker::Readings FreezeTracker::fresh(int64_t module) const {
  Readings r;
  if (opt_.refreeze_tolerance == RefreezeTolerance::remeasure) return r;
  const Kept& k = kept_[size_t(module)];
  if (k.first.size() < 3) return r;
  r.first_slopes = k.first;
  r.peak_slope = k.peak;
  r.tolerance_lr = k.lr;
  return r;
}

void FreezeTracker::start_module() {
  if (ahead_.empty()) {
    cur_ = fresh(front_);
    return;
  }
  cur_ = std::move(ahead_.front());
  ahead_.erase(ahead_.begin());
}

double FreezeTracker::tolerance(const Readings& r, double lr) const {
  if (r.first_slopes.size() < 3) return 0;
  const double first = *std::max_element(r.first_slopes.begin(), r.first_slopes.end());
  const double t = opt_.tolerance_coef * (opt_.tolerance_from_peak() ? std::max(first, r.peak_slope) : first);
  if (opt_.refreeze_tolerance == RefreezeTolerance::scaled && r.tolerance_lr > 0) return t * lr / r.tolerance_lr;
  return t;
}

bool FreezeTracker::last_phase_lr(double lr) const {
  return !opt_.freeze_last_phase && opt_.final_lr >= 0 && lr < opt_.unfreeze_lr_factor * opt_.final_lr * (1 - 1e-9);
}

void FreezeTracker::drop_holds() {
  leave_module();
  front_ = 0;
  ahead_.clear();
  start_module();
}

Decision FreezeTracker::observe_lr(int64_t step, double lr) {
  const bool held = holding();
  peak_lr_ = std::max(peak_lr_, lr);
  if (!first_phase_over_ && lr * opt_.unfreeze_lr_factor <= peak_lr_ * (1 + 1e-9)) first_phase_over_ = true;
  if (!held || holding() || front_ == 0) return Decision::none;
  if (last_phase_lr(lr)) {  // the fall reaches the last phase, which trains whole: the holds lapse
    drop_holds();
    return Decision::none;  // check_lr logs "last_phase"
  }
  // The first phase is over: the held freezes apply, and the LR unfreeze counts from here.
  Event e = event("freeze", step, lr);
  e.module = front_ - 1;  // modules [0, front_) freeze
  e.reason = "held";
  events_.push_back(e);
  lr_at_front_freeze_ = lr;
  return Decision::freeze;
}

Decision FreezeTracker::bootstrap_check(int64_t step, double loss, double lr) {
  if (!bootstrapping_) return Decision::none;
  observe_lr(step, lr);  // the peak LR (nothing is held yet)
  Event e = event("bootstrap", step, lr);
  e.loss = loss;
  e.prev_loss = prev_loss_;
  events_.push_back(e);
  const bool ends =
      prev_loss_ > 0 && std::isfinite(loss) && std::abs(loss - prev_loss_) / prev_loss_ < opt_.bootstrap_change;
  prev_loss_ = loss;
  if (!ends) return Decision::none;
  bootstrapping_ = false;
  return Decision::end_bootstrap;
}

void FreezeTracker::add_reading(Readings& r, double p, double lr, Event& e) {
  const size_t w = size_t(window_);
  r.raw.push_back(p);
  const size_t k = std::min(r.raw.size(), w);
  double avg = 0;
  for (size_t i = r.raw.size() - k; i < r.raw.size(); ++i) avg += r.raw[i];
  avg /= double(k);
  r.smoothed.push_back(avg);
  e.smoothed = avg;
  // Slopes are fitted to full-window averages only: the first W-1 average fewer
  // readings, and with a refreshed reference those sit on one edge of the sawtooth
  // (Note [Egeria's freezing decisions]); T would come from that edge.
  const size_t full = r.smoothed.size() >= w ? r.smoothed.size() - w + 1 : 0;
  const size_t m = std::min(full, std::max<size_t>(w, 2));
  if (m >= 2) {
    const double s = fit_slope(std::vector<double>(r.smoothed.end() - long(m), r.smoothed.end()));
    e.slope = s;
    e.has_slope = true;
    if (r.first_slopes.size() < 3) {
      r.first_slopes.push_back(std::abs(s));
      if (r.first_slopes.size() == 3) r.tolerance_lr = lr;
      r.counter = 0;  // the first fits define T and are never stale
    } else {
      r.peak_slope = std::max(r.peak_slope, std::abs(s));  // T (peak) includes this fit
      const double t = tolerance(r, lr);
      e.tolerance = t;
      r.counter = std::abs(s) < t ? r.counter + 1 : 0;
    }
  }
  if (e.tolerance == 0) e.tolerance = tolerance(r, lr);
  e.counter = r.counter;
}

Decision FreezeTracker::check_plasticity(int64_t step, double p, double lr) {
  return check_plasticity(step, front_, p, lr);
}

double FreezeTracker::reading_of(double p, double lr_sq, Event& e) {
  e.plasticity = p;
  e.lr_sq = lr_sq;
  return lr_sq > 0 ? p / lr_sq : p;
}

Decision FreezeTracker::check_plasticity(int64_t step, int64_t module, double p, double lr, double lr_sq) {
  EG_CHECK(!bootstrapping_, "plasticity reported during bootstrapping");
  if (done()) return check_lr(step, lr);  // Algorithm 1 line 4: the last module is never evaluated
  EG_CHECK(reads(module), "a plasticity reading of module ", module, ", which is not read now (the front is ", front_,
           ", read up to ", last_read(), ")");
  if (module > front_) {  // a unit read ahead of the front: its history grows, it does not freeze
    const size_t i = size_t(module - front_ - 1);
    while (ahead_.size() <= i) ahead_.push_back(fresh(front_ + 1 + int64_t(ahead_.size())));
    Event e = event("evaluation", step, lr);
    e.module = module;
    add_reading(ahead_[i], reading_of(p, lr_sq, e), lr, e);
    events_.push_back(e);
    return Decision::none;
  }
  Event e = event("evaluation", step, lr);
  add_reading(cur_, reading_of(p, lr_sq, e), lr, e);
  events_.push_back(e);
  ++evals_since_refresh_;
  if (cur_.counter >= window_) {
    const bool hold = holding();
    events_.push_back(event(hold ? "hold" : "freeze", step, lr));
    if (!hold && lr_at_front_freeze_ == 0) lr_at_front_freeze_ = lr;
    leave_module();
    ++front_;
    start_module();
    return hold ? Decision::none : Decision::freeze;
  }
  return check_lr(step, lr);
}

void FreezeTracker::unfreeze_all(int64_t step, double lr, const char* why) {
  Event e = event("unfreeze", step, lr);
  e.counter = 0;
  leave_module();
  front_ = 0;
  ahead_.clear();
  lr_at_front_freeze_ = 0;
  window_ = std::max<int64_t>(std::min(opt_.min_window, window_), window_ / 2);
  e.window = window_;
  e.reason = why;
  events_.push_back(e);
  start_module();
}

Decision FreezeTracker::check_lr(int64_t step, double lr) {
  // The LR's fall is seen here (every step, and after every reading that does not
  // freeze): a freeze decided by a reading at the fallen LR is held, then applied here.
  if (observe_lr(step, lr) == Decision::freeze) return Decision::freeze;
  if (opt_.unfreeze_on_lr_fall && front_ > 0 && lr_at_front_freeze_ > 0 &&
      lr * opt_.unfreeze_lr_factor <= lr_at_front_freeze_ * (1 + 1e-9)) {
    unfreeze_all(step, lr, "lr");
    return Decision::unfreeze_all;
  }
  if (!last_phase_ && last_phase_lr(lr)) {
    last_phase_ = true;
    if (frozen() > 0) {
      unfreeze_all(step, lr, "last_phase");
      return Decision::unfreeze_all;
    }
    if (front_ > 0) drop_holds();  // held freezes, never applied, lapse
    events_.push_back(event("last_phase", step, lr));
    return Decision::none;
  }
  if (front_ > 0 && !holding() && custom_unfreeze && custom_unfreeze(step, lr)) {
    unfreeze_all(step, lr, "custom");
    return Decision::unfreeze_all;
  }
  return Decision::none;
}

bool FreezeTracker::refresh_due() const {
  const int64_t every = opt_.refresh_every > 0 ? opt_.refresh_every : window_;
  return !bootstrapping_ && evals_since_refresh_ >= every;
}

void FreezeTracker::reference_refreshed(int64_t step, double lr) {
  events_.push_back(event("refresh", step, lr));
  evals_since_refresh_ = 0;  // the histories stay: see Note [Egeria's freezing decisions]
}

std::vector<Event> FreezeTracker::take_events() {
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

json FreezeTracker::state() const {
  json kept = json::array();
  for (auto& k : kept_) kept.push_back({{"first", k.first}, {"peak", k.peak}, {"lr", k.lr}});
  json ahead = json::array();
  for (auto& r : ahead_) ahead.push_back(r.to_json());
  json j = {{"bootstrapping", bootstrapping_},
            {"prev_loss", prev_loss_},
            {"front", front_},
            {"window", window_},
            {"evals_since_refresh", evals_since_refresh_},
            {"lr_at_front_freeze", lr_at_front_freeze_},
            {"last_phase", last_phase_},
            {"ahead", ahead},
            {"kept", kept},
            {"num_modules", num_modules_},
            {"peak_lr", peak_lr_},
            {"first_phase_over", first_phase_over_}};
  j.update(cur_.to_json());  // the front's readings at the top level, as before lookahead
  return j;
}

void FreezeTracker::load_state(const json& s) {
  EG_CHECK(s.at("num_modules").get<int64_t>() == num_modules_, "the checkpoint's freezing state is for ",
           s.at("num_modules").get<int64_t>(), " layer modules, this model has ", num_modules_);
  bootstrapping_ = s.at("bootstrapping");
  prev_loss_ = s.at("prev_loss");
  front_ = s.at("front");
  window_ = s.at("window");
  evals_since_refresh_ = s.at("evals_since_refresh");
  lr_at_front_freeze_ = s.at("lr_at_front_freeze");
  cur_ = Readings::from_json(s);
  last_phase_ = s.value("last_phase", false);  // absent in checkpoints from before the option
  ahead_.clear();  // likewise (before lookahead)
  for (auto& r : s.value("ahead", json::array())) ahead_.push_back(Readings::from_json(r));
  // Likewise: a checkpoint from before --freeze-first-phase, resumed with it off, holds
  // nothing it had frozen (its peak LR is then the largest seen from the resume on).
  peak_lr_ = s.value("peak_lr", 0.0);
  first_phase_over_ = s.value("first_phase_over", front_ > 0 || lr_at_front_freeze_ > 0);
  kept_.assign(size_t(num_modules_), Kept());
  if (s.contains("kept")) {
    const json& k = s.at("kept");
    EG_CHECK(k.size() == kept_.size(), "the checkpoint's freezing state keeps tolerances for ", k.size(),
             " modules, this model has ", num_modules_);
    for (size_t i = 0; i < kept_.size(); ++i)
      kept_[i] = {k[i].at("first").get<std::vector<double>>(), k[i].at("peak").get<double>(),
                  k[i].at("lr").get<double>()};
  }
}

}  // namespace eg::freeze
