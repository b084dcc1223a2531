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
  e.counter = counter_;
  e.window = window_;
  e.lr = lr;
  return e;
}

void FreezeTracker::leave_module() {
  if (first_slopes_.size() == 3) kept_[size_t(front_)] = {first_slopes_, peak_slope_, tolerance_lr_};
}

void FreezeTracker::start_module() {
  raw_.clear();
  smoothed_.clear();
  first_slopes_.clear();
  peak_slope_ = 0;
  tolerance_lr_ = 0;
  counter_ = 0;
  if (opt_.refreeze_tolerance == RefreezeTolerance::remeasure) return;
  const Kept& k = kept_[size_t(front_)];
  if (k.first.size() < 3) return;
  first_slopes_ = k.first;
  peak_slope_ = k.peak;
  tolerance_lr_ = k.lr;
}

double FreezeTracker::tolerance(double lr) const {
  if (first_slopes_.size() < 3) return 0;
  const double first = *std::max_element(first_slopes_.begin(), first_slopes_.end());
  const double t = opt_.tolerance_coef * (opt_.tolerance_from_peak ? std::max(first, peak_slope_) : first);
  if (opt_.refreeze_tolerance == RefreezeTolerance::scaled && tolerance_lr_ > 0) return t * lr / tolerance_lr_;
  return t;
}

bool FreezeTracker::last_phase_lr(double lr) const {
  return !opt_.freeze_last_phase && opt_.final_lr >= 0 && lr < opt_.unfreeze_lr_factor * opt_.final_lr * (1 - 1e-9);
}

void FreezeTracker::drop_holds() {
  leave_module();
  front_ = 0;
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

Decision FreezeTracker::check_plasticity(int64_t step, double p, double lr) {
  EG_CHECK(!bootstrapping_, "plasticity reported during bootstrapping");
  if (done()) return check_lr(step, lr);  // Algorithm 1 line 4: the last module is never evaluated
  const size_t w = size_t(window_);
  raw_.push_back(p);
  const size_t k = std::min(raw_.size(), w);
  double avg = 0;
  for (size_t i = raw_.size() - k; i < raw_.size(); ++i) avg += raw_[i];
  avg /= double(k);
  smoothed_.push_back(avg);
  Event e = event("evaluation", step, lr);
  e.plasticity = p;
  e.smoothed = avg;
  // Slopes are fitted to full-window averages only: the first W-1 average fewer
  // readings, and with a refreshed reference those sit on one edge of the sawtooth
  // (Note [Egeria's freezing decisions]); T would come from that edge.
  const size_t full = smoothed_.size() >= w ? smoothed_.size() - w + 1 : 0;
  const size_t m = std::min(full, std::max<size_t>(w, 2));
  if (m >= 2) {
    const double s = fit_slope(std::vector<double>(smoothed_.end() - long(m), smoothed_.end()));
    e.slope = s;
    e.has_slope = true;
    if (first_slopes_.size() < 3) {
      first_slopes_.push_back(std::abs(s));
      if (first_slopes_.size() == 3) tolerance_lr_ = lr;
      counter_ = 0;  // the first fits define T and are never stale
    } else {
      peak_slope_ = std::max(peak_slope_, std::abs(s));  // T (peak) includes this fit
      const double t = tolerance(lr);
      e.tolerance = t;
      counter_ = std::abs(s) < t ? counter_ + 1 : 0;
    }
  }
  if (e.tolerance == 0) e.tolerance = tolerance(lr);
  e.counter = counter_;
  events_.push_back(e);
  ++evals_since_refresh_;
  if (counter_ >= window_) {
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
  return {{"bootstrapping", bootstrapping_},
          {"prev_loss", prev_loss_},
          {"front", front_},
          {"window", window_},
          {"counter", counter_},
          {"evals_since_refresh", evals_since_refresh_},
          {"lr_at_front_freeze", lr_at_front_freeze_},
          {"raw", raw_},
          {"smoothed", smoothed_},
          {"first_slopes", first_slopes_},
          {"peak_slope", peak_slope_},
          {"last_phase", last_phase_},
          {"tolerance_lr", tolerance_lr_},
          {"kept", kept},
          {"num_modules", num_modules_},
          {"peak_lr", peak_lr_},
          {"first_phase_over", first_phase_over_}};
}

void FreezeTracker::load_state(const json& s) {
  EG_CHECK(s.at("num_modules").get<int64_t>() == num_modules_, "the checkpoint's freezing state is for ",
           s.at("num_modules").get<int64_t>(), " layer modules, this model has ", num_modules_);
  bootstrapping_ = s.at("bootstrapping");
  prev_loss_ = s.at("prev_loss");
  front_ = s.at("front");
  window_ = s.at("window");
  counter_ = s.at("counter");
  evals_since_refresh_ = s.at("evals_since_refresh");
  lr_at_front_freeze_ = s.at("lr_at_front_freeze");
  raw_ = s.at("raw").get<std::vector<double>>();
  smoothed_ = s.at("smoothed").get<std::vector<double>>();
  first_slopes_ = s.at("first_slopes").get<std::vector<double>>();
  peak_slope_ = s.value("peak_slope", 0.0);  // absent in checkpoints from before the option
  last_phase_ = s.value("last_phase", false);  // likewise
  tolerance_lr_ = s.value("tolerance_lr", 0.0);  // likewise (remeasure: unused)
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
