#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "autograd/node.h"
#include "core/error.h"
#include "freeze/policies.h"
#include "freeze/smartfrz.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

// Note [SmartFRZ's freezing stage]
// Every stage_every steps the units still training whose windows are full (Note
// [SmartFRZ's weight histories]) go to the predictor, on a background thread as Egeria's
// reference (niced, --freeze-threads threads), and its answer is acted on one step later,
// waiting for it there if it is late: the decisions do not depend on the machine's
// timing, and a resumed run makes the same ones. Order prefix freezes the front units
// the predictor names, up to the first one it keeps (a prefix, as Egeria's: no backward
// at all, and the activation cache can serve it); order any freezes every unit it names
// (Note [Frozen sets]: a unit behind trainable ones skips its weight gradients and
// update); either freezes at most max_per_stage of them, front first. A unit is named
// when its P(freeze) is at or over the threshold at the last `patience` stages that read
// it (its streak, which a stage under the threshold ends). The last unit (the head)
// never freezes. A frozen unit is no longer recorded
// and does not unfreeze: SmartFRZ describes no unfreezing.

// Note [SmartFRZ waits for learning]
// The predictor reads how a unit's weights move, and a network that has not started to
// learn moves them little: ResNet-56 on 6,000 Fashion-MNIST images sat at chance for
// three epochs (training loss 2.26-2.30 against the 2.30 of predicting the class
// frequencies), and SmartFRZ froze its first units there and lost the run
// (docs/results/2026-12-05-smartfrz-resnet56.md). So a stage runs only once learning has
// begun: the mean training loss of the steps since the last stage must be at most
// start_below times the task's constant loss, the loss of predicting the training
// targets' frequencies whatever the input (PolicyConfig::constant_loss). Once it is, the
// stages run as published; stages held before are logged ("held") and do not count
// towards a unit's streak. The default 0.75 lets every run that learns from its first
// epoch start at its first stage (ResNet-20 from scratch ends its first epoch at 0.63 of
// it, a fine-tuned head at 0.4-0.5); a task that gives no constant loss is not held.
struct StageResult {
  int64_t step = 0;  // the stage's
  std::vector<int64_t> units;
  std::vector<double> p;  // P(freeze), a unit each
};

// The predictor's thread: one stage at a time.
class PredictorWorker {
 public:
  using Predict = std::function<std::vector<double>(const std::vector<int64_t>&, const Tensor&)>;
  PredictorWorker(Predict predict, ControllerOptions o) : predict_(std::move(predict)), o_(o) {
    if (!o_.synchronous) thread_ = std::thread([this] { loop(); });
  }
  ~PredictorWorker() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  PredictorWorker(const PredictorWorker&) = delete;
  PredictorWorker& operator=(const PredictorWorker&) = delete;

  void submit(int64_t step, std::vector<int64_t> units, Tensor windows) {
    if (o_.synchronous) {
      const int64_t t0 = thread_cpu_ns();
      result_ = StageResult{step, units, predict_(units, windows)};
      cpu_ns_ += thread_cpu_ns() - t0;
      return;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = Job{step, std::move(units), std::move(windows)};
    }
    cv_.notify_all();
  }
  // The submitted stage's answer, waiting for it if need be.
  StageResult wait() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return result_.has_value() || !error_.empty(); });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EG_CHECK(error_.empty(), "--freeze smartfrz: the predictor failed: ", error_);
    StageResult r = std::move(*result_);
    result_.reset();
    return r;
  }
  double cpu_seconds() const { return double(cpu_ns_.load()) * 1e-9; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Job {
    int64_t step;
    std::vector<int64_t> units;
    Tensor windows;
  };
  void loop() {
    background_thread_setup(o_);
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || job_.has_value(); });
      if (stop_) return;
      Job j = std::move(*job_);
      job_.reset();
      l.unlock();
      StageResult r{j.step, j.units, {}};
      std::string err;
      const int64_t t0 = thread_cpu_ns();
      try {
        r.p = predict_(j.units, j.windows);
        if (r.p.size() != j.units.size())
          err = "it gave " + std::to_string(r.p.size()) + " answers for " + std::to_string(j.units.size()) + " units";
      } catch (const std::exception& e) {
        err = e.what();
      }
      cpu_ns_ += thread_cpu_ns() - t0;
      l.lock();
      if (err.empty()) result_ = std::move(r);
      else error_ = err;
      cv_.notify_all();
    }
  }

  Predict predict_;
  ControllerOptions o_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;
  std::optional<StageResult> result_;
  std::string error_;
  bool stop_ = false;
  std::atomic<int64_t> cpu_ns_{0};
  double wait_seconds_ = 0;
  std::thread thread_;  // last: started once the rest exists
};

// A unit's last `window` records, oldest first once read, each with the mean LR of the
// steps since the record before it (Note [SmartFRZ's predictor input]).
struct Window {
  std::vector<float> rows;  // window x tailor, a ring
  std::vector<float> lrs;  // window, the same ring
  int64_t count = 0, head = 0;
  void push(const std::vector<float>& r, float lr, int64_t window) {
    const size_t t = r.size();
    if (rows.size() != size_t(window) * t) rows.assign(size_t(window) * t, 0.0f), lrs.assign(size_t(window), 0.0f);
    std::copy(r.begin(), r.end(), rows.begin() + std::ptrdiff_t(size_t(head) * t));
    lrs[size_t(head)] = lr;
    head = (head + 1) % window;
    count = std::min(count + 1, window);
  }
  std::vector<float> chronological_lrs(int64_t window) const {
    std::vector<float> out(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out[size_t(i)] = lrs[size_t((head - count + i + window) % window)];
    return out;
  }
  Tensor chronological(int64_t window, int64_t tailor) const {
    std::vector<float> out(size_t(count * tailor));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = (head - count + i + window) % window;
      std::copy(rows.begin() + row * tailor, rows.begin() + (row + 1) * tailor, out.begin() + i * tailor);
    }
    return Tensor::from_vector(out, {count, tailor});
  }
  void clear() { *this = Window(); }
};

class SmartFrzPolicy : public FreezePolicy {
 public:
  SmartFrzPolicy(const PolicyConfig& c, int64_t units)
      : c_(c), units_(units), frozen_flag_(size_t(units), false), streak_(size_t(units), 0) {
    const SmartFrzOptions& o = c.smartfrz;
    EG_CHECK(o.threshold > 0 && o.threshold < 1, "--smartfrz-threshold must be in (0, 1), got ", o.threshold);
    EG_CHECK(o.patience >= 1, "--smartfrz-patience must be at least 1, got ", o.patience);
    EG_CHECK(o.start_below >= 0, "--smartfrz-start-below must be 0 (off) or positive, got ", o.start_below);
    start_loss_ = o.start_below * c.constant_loss;
    started_ = !(start_loss_ > 0);
    PredictorWorker::Predict predict = o.predict;
    file_ = o.predict ? "(given by the program)" : o.predictor;
    if (!predict) {
      EG_CHECK(!c.smartfrz_weights.empty(),
               "--freeze smartfrz needs a trained predictor: none is installed (share/smartfrz-predictor.safetensors, "
               "made by bench/train_smartfrz_predictor.py); give --smartfrz-predictor FILE");
      geometry_ = SmartFrzGeometry::from_metadata(c.smartfrz_metadata, file_);
      auto p = std::make_shared<SmartFrzPredictor>(geometry_);
      p->load(c.smartfrz_weights, file_);
      p->eval();
      predict = [p](const std::vector<int64_t>&, const Tensor& w) { return p->freeze_probability(w); };
    }
    window_ = o.window > 0 ? o.window : geometry_.window;
    EG_CHECK(window_ >= 2, "--smartfrz-window must be at least 2 (the newest record queries the older ones), got ",
             window_);
    const int64_t epoch = c.steps_per_epoch, total = c.total_steps;
    record_every_ = o.record_every > 0 ? o.record_every
                    : epoch > 0        ? std::max<int64_t>(1, epoch / window_)
                                       : std::max<int64_t>(1, total / (10 * window_));
    stage_every_ = o.stage_every > 0 ? o.stage_every : epoch > 0 ? epoch : std::max<int64_t>(1, total / 10);
    if (total > 0) {
      EG_CHECK(window_ * record_every_ <= total, "--freeze smartfrz: a window of ", window_, " records, one every ",
               record_every_, " steps, takes ", window_ * record_every_, " steps to fill, and the run has only ", total,
               ": no freezing stage could decide (--smartfrz-window, --smartfrz-record-every)");
      EG_CHECK(stage_every_ <= total, "--smartfrz-stage-every ", stage_every_, " is longer than the run (", total,
               " steps): no freezing stage would run");
    }
    ControllerOptions w = c.reference;
    worker_ = std::make_unique<PredictorWorker>(std::move(predict), w);
    windows_.resize(size_t(units));
  }

  void after_step(const StepInfo& s, const Tensor&, const Tensor&, models::Model& m) override {
    if (pending_) {
      ready_ = worker_->wait();
      pending_ = false;
    }
    if (ready_) act(*std::exchange(ready_, std::nullopt), s);
    if (!started_ && s.trained) losses_.add(s.loss);
    lr_sum_ += s.lr, ++lr_steps_;
    if (s.step % record_every_ == 0) record(m);
    if (s.step % stage_every_ == 0 && (started_ || learning_began(s))) stage(s);
  }
  UnitSet frozen_units() const override { return frozen_; }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }

  json state() const override {
    drain();  // the windows travel as state_tensors()
    json j = {{"frozen", frozen_},         {"stages", stages_},   {"records", records_},
              {"streak", streak_},         {"started", started_}, {"loss_sum", losses_.sum()},
              {"loss_n", losses_.count()}, {"lr_sum", lr_sum_},   {"lr_steps", lr_steps_}};
    if (ready_) j["ready"] = {{"step", ready_->step}, {"units", ready_->units}, {"p", ready_->p}};
    return j;
  }
  void load_state(const json& j) override {
    frozen_ = j.value("frozen", UnitSet());
    std::fill(frozen_flag_.begin(), frozen_flag_.end(), false);
    for (int64_t u : frozen_) frozen_flag_.at(size_t(u)) = true;
    stages_ = j.value("stages", int64_t(0));
    records_ = j.value("records", int64_t(0));
    streak_.assign(size_t(units_), 0);
    if (j.contains("streak")) {
      const auto v = j["streak"].get<std::vector<int64_t>>();
      EG_CHECK(v.size() == streak_.size(), "--freeze smartfrz: the checkpoint's streaks are of ", v.size(),
               " units, this run has ", units_);
      streak_ = v;
    }
    // A checkpoint from before the wait ran its stages.
    started_ = j.value("started", true) || !(start_loss_ > 0);
    losses_.restore(j.value("loss_sum", 0.0), j.value("loss_n", int64_t(0)));
    lr_sum_ = j.value("lr_sum", 0.0);
    lr_steps_ = j.value("lr_steps", int64_t(0));
    ready_.reset();
    if (j.contains("ready"))
      ready_ = StageResult{j["ready"].at("step").get<int64_t>(), j["ready"].at("units").get<std::vector<int64_t>>(),
                           j["ready"].at("p").get<std::vector<double>>()};
    for (auto& w : windows_) w.clear();
  }
  std::map<std::string, Tensor> state_tensors() const override {
    std::map<std::string, Tensor> t;
    for (size_t u = 0; u < windows_.size(); ++u)
      if (windows_[u].count > 0) {
        const std::string k = std::to_string(u);
        t["smartfrz/window/" + k] = windows_[u].chronological(window_, tailor_n());
        t["smartfrz/window_lr/" + k] = Tensor::from_vector(windows_[u].chronological_lrs(window_), {windows_[u].count});
      }
    return t;
  }
  void load_state_tensors(const std::map<std::string, Tensor>& t) override {
    for (auto& [k, v] : t) {
      if (k.rfind("smartfrz/window/", 0) != 0) continue;
      const std::string unit = k.substr(16);
      const size_t u = size_t(std::stoll(unit));
      EG_CHECK(u < windows_.size() && v.dim() == 2 && v.size(0) <= window_ && v.size(1) == tailor_n(),
               "--freeze smartfrz: the checkpoint's window ", k, " ", shape_str(v.shape()), " does not fit this run (",
               window_, " records of ", tailor_n(), " weights)");
      // A checkpoint of an egeria before the LRs were kept: a predictor of input movement
      // does not read them; one of movement-per-lr cannot go on from it.
      std::vector<float> lrs(size_t(v.size(0)), 0.0f);
      if (auto l = t.find("smartfrz/window_lr/" + unit); l != t.end()) {
        EG_CHECK(l->second.dim() == 1 && l->second.size(0) == v.size(0), "--freeze smartfrz: the checkpoint's ",
                 l->first, " ", shape_str(l->second.shape()), " does not match its window's ", v.size(0), " records");
        lrs = l->second.to_vector<float>();
      } else {
        EG_CHECK(geometry_.input == SmartFrzInput::movement,
                 "--freeze smartfrz: the checkpoint's windows carry no learning rates (written by an older egeria), "
                 "and predictor ",
                 file_,
                 " reads movement per unit of LR: resume with the predictor the run began "
                 "with, or start the run again");
      }
      const std::vector<float> rows = v.to_vector<float>();
      windows_[u].clear();
      for (int64_t i = 0; i < v.size(0); ++i)
        windows_[u].push({rows.begin() + i * v.size(1), rows.begin() + (i + 1) * v.size(1)}, lrs[size_t(i)], window_);
    }
  }
  void quiesce() override { drain(); }
  json stats() const override {
    return {{"stages", stages_},
            {"records", records_},
            {"window", window_},
            {"record_every", record_every_},
            {"stage_every", stage_every_},
            {"tailor", tailor_n()},
            {"order", c_.smartfrz.order == SmartFrzOrder::prefix ? "prefix" : "any"},
            {"threshold", c_.smartfrz.threshold},
            {"max_per_stage", c_.smartfrz.max_per_stage},
            {"patience", c_.smartfrz.patience},
            {"start_below", c_.smartfrz.start_below},
            {"constant_loss", c_.constant_loss},
            {"predictor", file_},
            {"input", smartfrz_input_name(geometry_.input)},
            {"record_seconds", record_seconds_},
            {"predictor_cpu_seconds", worker_->cpu_seconds()},
            {"predictor_wait_seconds", worker_->wait_seconds()}};
  }

 private:
  int64_t tailor_n() const { return geometry_.tailor; }
  void drain() const {
    if (!pending_) return;
    ready_ = worker_->wait();
    pending_ = false;
  }

  // Note [SmartFRZ waits for learning]: whether this stage and every later one runs.
  bool learning_began(const StepInfo& s) {
    if (losses_.count() == 0) return false;  // no step since the last stage trained anything
    const double mean = losses_.mean();
    losses_.clear();
    started_ = mean <= start_loss_;
    log_.push_back({{"type", started_ ? "start" : "held"},
                    {"step", s.step},
                    {"train_loss", mean},
                    {"start_loss", start_loss_},
                    {"constant_loss", c_.constant_loss}});
    return started_;
  }

  void record(models::Model& m) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!tailored_) tailored_ = std::make_unique<TailoredWeights>(m, c_.partition, tailor_n(), c_.seed);
    const float lr = float(lr_sum_ / double(std::max<int64_t>(1, lr_steps_)));
    lr_sum_ = 0, lr_steps_ = 0;
    for (int64_t u = 0; u + 1 < units_; ++u)
      if (!frozen_flag_[size_t(u)] && !tailored_->empty(u)) windows_[size_t(u)].push(tailored_->read(u), lr, window_);
    ++records_;
    record_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void stage(const StepInfo& s) {
    std::vector<int64_t> units;
    std::vector<float> feats;
    for (int64_t u = 0; u + 1 < units_; ++u) {
      if (frozen_flag_[size_t(u)] || windows_[size_t(u)].count < window_) continue;
      const Window& w = windows_[size_t(u)];
      const Tensor f = smartfrz_features(
          w.chronological(window_, tailor_n()), geometry_.gain,
          geometry_.input == SmartFrzInput::movement_per_lr ? w.chronological_lrs(window_) : std::vector<float>());
      const std::vector<float> v = f.to_vector<float>();
      feats.insert(feats.end(), v.begin(), v.end());
      units.push_back(u);
    }
    if (units.empty()) return;
    const int64_t n = int64_t(units.size());
    worker_->submit(s.step, std::move(units), Tensor::from_vector(feats, {n, window_, tailor_n()}));
    pending_ = true;
    ++stages_;
  }
  void act(const StageResult& r, const StepInfo& s) {
    log_.push_back({{"type", "stage"}, {"step", r.step}, {"units", r.units}, {"p_freeze", r.p}});
    const double thr = c_.smartfrz.threshold;
    std::vector<int64_t> froze, streak;
    std::vector<double> why;
    std::vector<double> p_of(size_t(units_), -1.0);  // -1: not read at this stage (its window was not full)
    for (size_t i = 0; i < r.units.size(); ++i) {
      const auto u = size_t(r.units[i]);
      p_of[u] = r.p[i];
      streak_[u] = r.p[i] >= thr ? streak_[u] + 1 : 0;
    }
    auto named = [&](int64_t u) { return p_of[size_t(u)] >= thr && streak_[size_t(u)] >= c_.smartfrz.patience; };
    const size_t most = c_.smartfrz.max_per_stage > 0 ? size_t(c_.smartfrz.max_per_stage) : size_t(units_);
    if (c_.smartfrz.order == SmartFrzOrder::prefix) {
      for (int64_t u = prefix_length(frozen_); u + 1 < units_ && froze.size() < most && named(u); ++u)
        froze.push_back(u), why.push_back(p_of[size_t(u)]);
    } else {
      for (int64_t u : r.units)
        if (froze.size() < most && !frozen_flag_[size_t(u)] && named(u))
          froze.push_back(u), why.push_back(p_of[size_t(u)]);
    }
    if (froze.empty()) return;
    for (int64_t u : froze) {
      streak.push_back(streak_[size_t(u)]);
      frozen_flag_[size_t(u)] = true;
      windows_[size_t(u)].clear();
    }
    frozen_.clear();
    for (int64_t u = 0; u < units_; ++u)
      if (frozen_flag_[size_t(u)]) frozen_.push_back(u);
    log_.push_back({{"type", "freeze"},
                    {"step", s.step},
                    {"froze", froze},
                    {"p_freeze", why},
                    {"streak", streak},  // the stages in a row each was named at
                    {"stage_step", r.step},
                    {"units", frozen_},
                    {"threshold", thr},
                    {"lr", s.lr}});
  }

  PolicyConfig c_;
  int64_t units_;
  SmartFrzGeometry geometry_;
  std::string file_;
  int64_t window_ = 0, record_every_ = 0, stage_every_ = 0;
  std::unique_ptr<PredictorWorker> worker_;
  mutable bool pending_ = false;  // a stage is with the worker
  mutable std::optional<StageResult> ready_;  // its answer, acted on at the next step
  std::unique_ptr<TailoredWeights> tailored_;  // made at the first record, from the model
  std::vector<Window> windows_;
  std::vector<bool> frozen_flag_;
  std::vector<int64_t> streak_;  // a unit's stages in a row at or over the threshold
  UnitSet frozen_;
  // Note [SmartFRZ waits for learning]: the loss a stage's steps must average at most
  // (0: no wait), whether stages run yet, and the losses since the last stage until then.
  double start_loss_ = 0;
  bool started_ = true;
  StepLosses losses_;
  // The LRs of the steps since the last record: their mean goes with the next record.
  double lr_sum_ = 0;
  int64_t lr_steps_ = 0;
  int64_t stages_ = 0, records_ = 0;
  double record_seconds_ = 0;
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_smartfrz_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<SmartFrzPolicy>(c, units);
}

}  // namespace eg::freeze
