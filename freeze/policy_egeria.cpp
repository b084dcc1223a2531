#include "freeze/policies.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"
#include "freeze/controller.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

std::shared_ptr<const Snapshot> take_snapshot(const models::Model& m) {
  auto s = std::make_shared<Snapshot>();
  for (auto& [k, t] : m.state_dict()) (*s)[k] = t.to(Device::cpu()).clone();
  return s;
}

class EgeriaPolicy : public FreezePolicy {
 public:
  EgeriaPolicy(const PolicyConfig& c, int64_t modules) : c_(c), tracker_(modules, with_interval(c, modules)) {
    ControllerOptions o = c.reference;
    // Each evaluation submits a reading per unit it reads; a pipeline for two evaluations.
    o.capacity = std::max<int>(o.capacity, int(2 * (1 + std::max<int64_t>(0, c.tracker.lookahead))));
    if (c.device.is_cuda()) o.gpu = c.device;
    o.max_cpu_load = c.max_cpu_load(c.device);
    tracker_.custom_unfreeze = c.unfreeze_hook;
    ctl_ = std::make_unique<PlasticityController>(c.make_model ? c.make_model : quant::model_factory(c.model), o);
  }

  int64_t capture_module(int64_t step) const override {
    if (tracker_.bootstrapping() || tracker_.done() || !ctl_->has_snapshot()) return -1;
    return (step + 1) % n() == 0 ? c_.partition.last_layer(tracker_.front()) : -1;
  }
  // The units read ahead of the front (Note [Reading ahead of the front]).
  std::vector<int64_t> capture_more(int64_t step) const override {
    std::vector<int64_t> layers;
    if (capture_module(step) < 0) return layers;
    for (int64_t u = tracker_.front() + 1; u <= tracker_.last_read(); ++u) layers.push_back(c_.partition.last_layer(u));
    return layers;
  }

  void after_step(const StepInfo& s, const Tensor& x, const Tensor& captured, models::Model& m) override {
    // The squared LRs of the updates before this step's, where its capture was taken.
    capture_lr_sq_ = lr_sq_total_;
    if (s.trained) {  // a step that trained nothing has no loss (not a loss of 0)
      losses_.add(s.loss);
      lr_sq_total_ += s.lr * s.lr;
    }
    if (tracker_.bootstrapping()) {
      if (s.step % bootstrap_n() == 0 && losses_.count() > 0) {
        const Decision d = tracker_.bootstrap_check(s.step, losses_.mean(), s.lr);
        losses_.clear();
        if (d == Decision::end_bootstrap) refresh(m, s.step, s.lr);
      }
    } else {
      // Without bootstrapping (Note [Bootstrapping a pretrained network]) the first
      // step's network is the first reference.
      if (!snapshot_) refresh(m, s.step, s.lr);
      // The step's LR first: a first phase that ends here applies its held freezes at
      // this step, before the readings (which may have been taken n steps ago).
      tracker_.observe_lr(s.step, s.lr);
      if (c_.apply_on_arrival) {
        if (captured.defined()) submit_all(s, x, captured, tracker_.front());
        act_on(ctl_->poll(), s, m);
      } else if (captured.defined()) {
        // The previous evaluation, n steps ago, is acted on now, whenever it finished:
        // the decisions do not depend on the machine's timing. With the reference far
        // cheaper than n training steps, drain() almost never waits (wait_seconds says).
        const int64_t captured_front = tracker_.front();
        ctl_->drain();
        act_on(ctl_->poll(), s, m);
        submit_all(s, x, captured, captured_front);
      }
      tracker_.check_lr(s.step, s.lr);
    }
    for (auto& e : tracker_.take_events()) log_.push_back(e.to_json());
  }
  UnitSet frozen_units() const override { return first_units(tracker_.frozen()); }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }

  json state() const override {
    ctl_->drain();
    json pending = json::array();
    for (auto& r : ctl_->pending()) pending.push_back({r.step, r.module, r.plasticity});
    return {{"tracker", tracker_.state()},
            {"loss_sum", losses_.sum()},
            {"loss_n", losses_.count()},
            {"interval", n()},
            {"bootstrap_interval", bootstrap_n()},
            {"pending", pending},
            {"reading_lr_sq", reading_lr_sq_json()},
            {"lr_sq_total", lr_sq_total_},
            {"lr_sq_at_reference", lr_sq_at_reference_},
            {"stale_results", stale_results_},
            {"reference_calibration", calibration_json()}};
  }
  void load_state(const json& j) override {
    tracker_.load_state(j.at("tracker"));
    losses_.restore(j.value("loss_sum", 0.0), j.value("loss_n", int64_t(0)));
    // An auto n or bootstrapping span is the checkpoint's: the build that started the run
    // may have derived another, and the run's readings so far are at its steps.
    if (c_.tracker.interval <= 0 && j.contains("interval")) resumed_n_ = j.at("interval").get<int64_t>();
    if (!j.contains("bootstrap_interval")) bootstrap_n_ = n();
    else if (c_.tracker.bootstrap_interval <= 0)
      bootstrap_n_ = std::max<int64_t>(0, j.at("bootstrap_interval").get<int64_t>());
    stale_results_ = j.value("stale_results", int64_t(0));
    std::vector<PlasticityController::Result> pending;
    for (auto& p : j.value("pending", json::array()))
      pending.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>(), p.at(2).get<double>()});
    ctl_->restore_pending(std::move(pending));
    reading_lr_sq_.clear();
    for (auto& p : j.value("reading_lr_sq", json::array()))
      reading_lr_sq_[p.at(0).get<int64_t>()] = p.at(1).get<double>();
    lr_sq_total_ = j.value("lr_sq_total", 0.0);
    lr_sq_at_reference_ = j.value("lr_sq_at_reference", 0.0);
    restored_calibration_.clear();
    const json cal = j.value("reference_calibration", json::object());  // (a temporary would dangle in the loop)
    for (auto& [name, r] : cal.items())
      restored_calibration_[name] = {r.at(0).get<float>(), r.at(1).get<float>(), r.at(2).get<int64_t>()};
  }
  std::map<std::string, Tensor> state_tensors() const override { return snapshot_ ? *snapshot_ : Snapshot(); }
  void load_state_tensors(const std::map<std::string, Tensor>& t) override {
    if (t.empty()) return;
    snapshot_ = std::make_shared<Snapshot>(t);
    ctl_->set_snapshot(snapshot_);
    ctl_->restore_calibration(snapshot_, std::exchange(restored_calibration_, {}));
  }
  void quiesce() override { ctl_->drain(); }
  json stats() const override {
    json j = {{"evaluations_completed", ctl_->completed()},
              {"evaluations_dropped", ctl_->dropped()},
              {"stale_results", stale_results_},
              {"reference_cpu_seconds", ctl_->background_cpu_seconds()},
              {"reference_gpu_seconds", ctl_->reference_gpu_seconds()},
              {"evaluation_wait_seconds", ctl_->wait_seconds()},
              {"apply", c_.apply_on_arrival ? "arrival" : "next"},
              {"snapshot_seconds", snapshot_seconds_},
              {"interval", n()},
              {"bootstrap_interval", bootstrap_n()},
              {"window", tracker_.window()},
              {"tolerance_from", tracker_.options().tolerance_from_peak() ? "peak" : "first3"},
              {"reference", c_.reference.precision},
              {"reference_bn", c_.reference.bn == quant::ReferenceBn::batch ? "batch" : "running"},
              {"unit_scope_submissions", unit_scope_submissions_},
              {"reference_max_cpu_load", ctl_->max_cpu_load()},
              {"reference_deferred", ctl_->deferred()},
              {"reference_deferred_seconds", ctl_->deferred_seconds()}};
    if (const std::string e = ctl_->first_error(); !e.empty()) j["first_evaluation_error"] = e;
    return j;
  }

 private:
  static TrackerOptions with_interval(const PolicyConfig& c, int64_t modules) {
    TrackerOptions o = c.tracker;
    if (o.interval <= 0)
      o.interval =
          default_interval(std::max<int64_t>(1, c.total_steps), modules, o.window, o.pretrained);  // see the Note
    if (o.bootstrap_interval == 0 && o.pretrained) o.bootstrap_interval = kNoBootstrapping;  // see the Note
    if (o.bootstrap_interval == -1) o.bootstrap_interval = o.interval;  // the paper's: every n
    if (o.bootstrap_interval == 0)
      o.bootstrap_interval =
          default_bootstrap_interval(std::max<int64_t>(1, c.total_steps), c.steps_per_epoch, o.interval);
    return o;
  }
  int64_t n() const { return resumed_n_ > 0 ? resumed_n_ : tracker_.options().interval; }
  // Steps between bootstrapping checks (Note [The bootstrapping check's span]); a
  // checkpoint from before it existed resumes with its run's n, as it had, and one with
  // an auto span with its own.
  int64_t bootstrap_n() const { return bootstrap_n_ > 0 ? bootstrap_n_ : tracker_.options().bootstrap_interval; }
  // The controller works in layer modules: the reference runs up to the front unit's
  // last, from the images or, given the unit's input, from the unit's first.
  void submit(const StepInfo& s, int64_t unit, const Tensor& x, const Tensor& out, const Tensor& input) {
    const FreezeUnit& u = c_.partition.units().at(size_t(unit));
    if (input.defined() && u.begin > 0)
      unit_scope_submissions_ += ctl_->submit(s.step, u.end - 1, x, out, s.x2, input, u.begin);
    else ctl_->submit(s.step, u.end - 1, x, out, s.x2);
  }
  // The step's captures were asked for when `captured_front` was the front: its output
  // in `captured`, the units after it in s.captured_more. Each unit still read is
  // submitted; a unit that froze while the step ran is no reading. Under the unit scope
  // the units are a chain: unit u + 1 starts from unit u's output.
  void submit_all(const StepInfo& s, const Tensor& x, const Tensor& captured, int64_t captured_front) {
    if (c_.tracker.readings_per_lr_sq)  // Note [Readings per squared learning rate]
      reading_lr_sq_[s.step] = std::max(std::abs(capture_lr_sq_ - lr_sq_at_reference_), s.lr * s.lr);
    Tensor out = captured, input = s.unit_input;
    for (int64_t u = captured_front;; ++u) {
      if (tracker_.reads(u)) submit(s, u, x, out, input);
      else ++stale_results_;
      if (u + 1 >= c_.partition.size()) break;
      const auto next = s.captured_more.find(c_.partition.last_layer(u + 1));
      if (next == s.captured_more.end()) break;
      if (s.unit_scope) input = out;
      out = next->second;
    }
  }
  void act_on(const std::vector<PlasticityController::Result>& results, const StepInfo& s, models::Model& m) {
    for (auto& r : results) {
      // A reading of a unit no longer read (frozen since, or the front moved back and
      // past it) is stale.
      const int64_t u = c_.partition.unit_of_last_layer(r.module);
      if (u < 0 || !tracker_.reads(u)) {
        ++stale_results_;
        continue;
      }
      tracker_.check_plasticity(r.step, u, r.plasticity, s.lr, lr_sq_of(r.step, s.lr));
      if (tracker_.refresh_due()) refresh(m, s.step, s.lr);
    }
  }
  // The squared LRs between the reference and the capture of `step` (0: raw readings).
  // Those of older captures are done with: results arrive in step order.
  double lr_sq_of(int64_t step, double lr) {
    if (!c_.tracker.readings_per_lr_sq) return 0;
    reading_lr_sq_.erase(reading_lr_sq_.begin(), reading_lr_sq_.lower_bound(step));
    const auto it = reading_lr_sq_.find(step);
    return it != reading_lr_sq_.end() ? it->second : lr * lr;  // (a checkpoint from before the option)
  }
  json reading_lr_sq_json() const {
    json j = json::array();
    for (auto& [step, v] : reading_lr_sq_) j.push_back({step, v});
    return j;
  }
  void refresh(models::Model& m, int64_t step, double lr) {
    auto t0 = std::chrono::steady_clock::now();
    snapshot_ = take_snapshot(m);
    ctl_->set_snapshot(snapshot_);
    snapshot_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lr_sq_at_reference_ = lr_sq_total_;  // the snapshot holds this step's update
    tracker_.reference_refreshed(step, lr);
  }

  PolicyConfig c_;
  FreezeTracker tracker_;
  std::unique_ptr<PlasticityController> ctl_;
  // The int8 reference's calibration for the current snapshot, as [lo, hi, batches]
  // by convolution (after drain()).
  json calibration_json() const {
    json j = json::object();
    for (auto& [name, r] : ctl_->calibration_for(snapshot_)) j[name] = {r.lo, r.hi, r.batches};
    return j;
  }
  std::shared_ptr<const Snapshot> snapshot_;
  quant::Calibration restored_calibration_;  // load_state's, until load_state_tensors restores the snapshot
  StepLosses losses_;  // since the last bootstrapping check
  double snapshot_seconds_ = 0;
  // Note [Readings per squared learning rate]: the sum of the squared LRs of every update
  // so far, at this step's capture (before its update), at the reference's snapshot, and
  // between the reference and each capture submitted and not yet acted on.
  double lr_sq_total_ = 0, capture_lr_sq_ = 0, lr_sq_at_reference_ = 0;
  std::map<int64_t, double> reading_lr_sq_;
  int64_t bootstrap_n_ = 0;  // > 0: a resumed checkpoint's
  int64_t resumed_n_ = 0;  // > 0: a resumed checkpoint's auto n
  int64_t stale_results_ = 0;
  int64_t unit_scope_submissions_ = 0;  // evaluations whose reference ran the front unit only
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_egeria_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<EgeriaPolicy>(c, units);
}

}  // namespace eg::freeze
