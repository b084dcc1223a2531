#include "train/freezing.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/ops.h"
#include "layers/layers.h"
#include "quant/reference.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace eg::train {

using json = nlohmann::json;

namespace {
void append(const std::string& path, const json& j) { append_json_line(path, j); }
}  // namespace

std::string shipped_smartfrz_predictor() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&shipped_smartfrz_predictor), &info) && info.dli_fname) {
    const auto p = std::filesystem::path(info.dli_fname).parent_path() / EG_SMARTFRZ_PREDICTOR_FROM_LIB;
    if (std::filesystem::exists(p)) return p.lexically_normal().string();
  }
  return std::filesystem::exists(EG_SMARTFRZ_PREDICTOR_SOURCE) ? EG_SMARTFRZ_PREDICTOR_SOURCE : "";
}

freeze::PolicyConfig policy_config(const TrainConfig& c) {
  freeze::PolicyConfig pc(c.freezing);
  pc.model.name = c.model;
  pc.device = Device::parse(c.device);
  pc.seed = c.seed;
  if (c.freezing.policy == "smartfrz" && !c.freezing.smartfrz.predict) {
    if (pc.smartfrz.predictor.empty()) pc.smartfrz.predictor = shipped_smartfrz_predictor();
    try {
      if (!pc.smartfrz.predictor.empty())
        pc.smartfrz_weights = load_safetensors(pc.smartfrz.predictor, &pc.smartfrz_metadata);
    } catch (const Error& e) {
      EG_THROW("--smartfrz-predictor: ", e.what());
    }
  }
  return pc;
}

FreezeRun::FreezeRun(const TrainConfig& c, models::Model& model, freeze::PolicyConfig pc, const std::string& out_dir,
                     const dist::Strategy& strategy)
    : model_(model),
      dp_(strategy),
      lead_(strategy.lead()),
      metrics_(out_dir + "/metrics.jsonl"),
      log_(out_dir + "/freeze.jsonl") {
  const auto layers = model.layer_modules();
  pc.partition = freeze::make_partition(model, c.freezing.units, c.freezing.unit_regex);
  part_ = pc.partition;
  if (!lead_) pc.policy = "none";  // See Note [Freezing across ranks]
  policy_ = freeze::make_policy(pc, int64_t(layers.size()));
  const std::vector<double> layer_flops = model.module_flops();
  const double params = double(model.num_parameters()), flops = std::max(model.flops_per_sample(), 1.0);
  for (auto& u : part_.units()) {
    unit_params_.push_back(double(u.params) / params);
    double f = 0;
    for (int64_t i = u.begin; i < u.end; ++i)
      f += layer_flops.size() == layers.size() ? layer_flops[size_t(i)] / flops
                                               : double(layers[size_t(i)].second->num_parameters()) / params;
    unit_flops_.push_back(f);
  }
  unit_scope_ =
      c.freezing.policy == "egeria" && c.freezing.reference_scope == ReferenceScope::unit && model.sequential();
  // A GPU reference in the background works on a side stream, its host work on a core of
  // its own: its device time is what it takes from training (reference_overhead_fraction).
  reference_on_training_cores_ =
      !Device::parse(c.device).is_cuda() ||
      (quant::reference_on_gpu(c.freezing.reference.precision) && c.freezing.reference.synchronous);
  out_dir_ = out_dir;
  if (c.freezing.smartfrz.record && lead_) {
    const freeze::SmartFrzOptions& o = c.freezing.smartfrz;
    const int64_t window = o.window > 0 ? o.window : freeze::SmartFrzGeometry().window;
    const int64_t every = o.record_every > 0 ? o.record_every : std::max<int64_t>(1, pc.steps_per_epoch / window);
    recorder_ = std::make_unique<SmartFrzRecorder>(
        model, part_, freeze::SmartFrzGeometry().tailor, every, o.probe, c.seed,
        std::map<std::string, std::string>{{"model", c.model},
                                           {"dataset", c.dataset},
                                           {"init_from", c.init_from},
                                           {"seed", std::to_string(c.seed)},
                                           {"steps_per_epoch", std::to_string(pc.steps_per_epoch)},
                                           {"total_steps", std::to_string(pc.total_steps)}});
  }
  for (auto& [name, mod] : model.named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(mod)) {
      bn->frozen_batch_stats = c.freezing.bn == FrozenBn::batch;
      batch_norms_.emplace_back(name, bn);
    }
  bn_settle_ = c.freezing.bn_settle_steps();
}

void FreezeRun::settle_batch_norms(const std::vector<char>& was_frozen) {
  // See Note [Settling a frozen BatchNorm] in layers/layers.h.
  bool started = false;
  for (size_t i = 0; i < batch_norms_.size(); ++i) {
    nn::BatchNorm2d* bn = batch_norms_[i].second;
    if (!bn->is_frozen()) {
      bn->settling = -1;
    } else if (!was_frozen[i]) {
      bn->settling = 0;
      started = true;
    }
  }
  if (started) settle_left_ = bn_settle_;
}

void FreezeRun::count_down_settling() {
  if (settle_left_ == 0 || --settle_left_ > 0) return;
  for (auto& [name, bn] : batch_norms_) bn->settling = -1;
  dp_.average_running_stats(model_);  // each rank averaged its own batches
}

freeze::UnitSet FreezeRun::rank0s(const freeze::UnitSet& s) const {
  if (dp_.size() == 1) return s;
  std::vector<int64_t> flags(size_t(part_.size()), 0);
  for (int64_t u : s) flags.at(size_t(u)) = 1;
  Tensor t = Tensor::from_vector(flags, {int64_t(flags.size())});
  dp_.comm().broadcast(t, 0);
  freeze::UnitSet r;
  for (int64_t u = 0; u < part_.size(); ++u)
    if (t.data<int64_t>()[u]) r.push_back(u);
  return r;
}

double FreezeRun::frozen_share(const std::vector<double>& share) const {
  double v = 0;
  for (int64_t u : frozen_)
    if (u < int64_t(share.size())) v += share[size_t(u)];
  return v;
}

double FreezeRun::prefix_share(const std::vector<double>& share) const {
  double v = 0;
  for (int64_t u = 0; u < freeze::prefix_length(frozen_) && u < int64_t(share.size()); ++u) v += share[size_t(u)];
  return v;
}

// Note [Backward FLOPs a frozen set saves]
// The share of the backward FLOPs a step skips, in forward FLOPs as the units' shares
// count them: the frozen prefix runs no backward at all, its whole share; a frozen unit
// behind a trainable one still computes the gradient of its input and skips its weight
// gradients, half its share (a convolution's or a linear layer's input and weight
// gradients each cost about its forward).
double FreezeRun::backward_saved_share() const {
  const double prefix = prefix_share(unit_flops_);
  return prefix + 0.5 * (frozen_share(unit_flops_) - prefix);
}

json FreezeRun::step_fields() const {
  json j = {{"frozen_modules", int64_t(frozen_.size())}, {"active_param_fraction", 1 - frozen_share(unit_params_)}};
  if (freeze::prefix_length(frozen_) != int64_t(frozen_.size())) j["frozen_units"] = frozen_;
  return j;
}

json FreezeRun::epoch_fields() {
  if (!cache_) return json::object();
  json j = {
      {"cache_hit_samples", epoch_hits_}, {"cache_miss_samples", epoch_misses_}, {"cache_lower_samples", epoch_lower_}};
  // The prefix's forward that the samples computed from the lower entries skipped, as a
  // share of it (the time model in bench/ costs them by it).
  if (epoch_lower_ > 0) j["cache_lower_forward_skipped"] = epoch_lower_skipped_ / double(epoch_lower_);
  epoch_hits_ = epoch_misses_ = epoch_lower_ = 0;
  epoch_lower_skipped_ = 0;
  return j;
}

void FreezeRun::use_cache(const std::string& dir, int64_t entries, bool force_disk) {
  cache_made_ = [this, dir, entries, force_disk] {
    return std::make_unique<cache::ActivationCache>(
        dir, entries, force_disk ? cache::Tier::disk : cache::Tier::automatic, dp_.comm().local_size());
  };
  cache_ = cache_made_();
}

void FreezeRun::move_cache_boundary(int64_t old_layers, double old_share) {
  // See Note [A growing prefix keeps its entries]
  const int64_t k = frozen_layers();
  if (k > old_layers && old_layers > 0 && cache_->key() == generation_ - 1) {
    below_.push_back({std::move(cache_), old_layers, old_share});
    cache_ = cache_made_();
    return;
  }
  drop_below();
  if (k == 0) cache_->release();  // unfrozen: its entries are dead weight
}

void FreezeRun::start_step(int64_t step) {
  capture_ = models::Capture();
  capture_.layer = lead_ ? policy_->capture_module(step) : -1;  // the policy runs on rank 0 only
  capture_.input_layer = unit_input_layer(capture_.layer);
  if (capture_.layer >= 0) capture_.more = policy_->capture_more(step);
  host_x_ = nullptr, host_x2_ = Tensor();
}

Tensor FreezeRun::forward(const StepBatch& b, const std::vector<int64_t>& ids, Device dev) {
  host_x_ = b.host_x, host_x2_ = b.host_x2;
  const Tensor& x = b.x;
  if (recorder_ && !recorder_->has_probe()) recorder_->offer_probe(x.to(dev), b.x2);
  const int64_t k = frozen_layers();
  ++steps_;
  // A capture inside the prefix needs the prefix run (the unit's input there is the
  // prefix's output, which the cache holds, when the front unit is the first unfrozen).
  if (!cache_ || k <= 0 || settle_left_ > 0 || (capture_.layer >= 0 && capture_.layer < k) ||
      (capture_.input_layer >= 0 && capture_.input_layer < k - 1))
    return model_.forward_frozen(cache_ ? x.to(dev) : x, b.x2, k, &capture_);
  return cached_forward(x, ids, dev);
}

void FreezeRun::drop_below() {
  for (auto& b : below_) {
    const cache::CacheStats& s = b.cache->stats();
    dropped_.prefetched += s.prefetched;
    dropped_.resets += s.resets + (s.entries > 0);
    dropped_.ever_on_disk = dropped_.ever_on_disk || s.ever_on_disk;
  }
  below_.clear();
}

cache::CacheStats FreezeRun::cache_stats() const {
  cache::CacheStats t = dropped_;
  auto add = [&t](const cache::ActivationCache& c) {
    t.prefetched += c.stats().prefetched;
    t.resets += c.stats().resets;
    t.bytes_reserved += c.stats().bytes_reserved;
    t.ever_on_disk = t.ever_on_disk || c.stats().ever_on_disk;
  };
  add(*cache_);
  for (auto& b : below_) add(*b.cache);
  t.peak_bytes_reserved = std::max(t.peak_bytes_reserved, t.bytes_reserved);
  return t;
}

Tensor FreezeRun::cached_forward(const Tensor& x, const std::vector<int64_t>& ids, Device dev) {
  const int64_t k = frozen_layers();
  cache_->set_key(generation_);  // See Note [Activation cache validity]
  std::vector<cache::ActivationCache::Lower> lowers;  // the longest shorter prefix first
  for (auto b = below_.rbegin(); b != below_.rend(); ++b) {
    const int64_t from = b->layers;
    lowers.push_back(
        {b->cache.get(), [this, from, k](const Tensor& h) { return model_.forward_layers(h, from, k, k); }});
  }
  const cache::ActivationCache::Pass p = cache_->through(
      ids, x, dev, [&](const Tensor& xs) { return model_.forward_layers(xs.to(dev), 0, k, k); }, lowers);
  const double share = prefix_share(unit_flops_);
  int64_t lower = 0;
  double skipped = 0;  // the lower samples' forward FLOP shares skipped
  for (size_t l = 0; l < lowers.size(); ++l) {
    lower += p.from_lower[l];
    skipped += double(p.from_lower[l]) * below_[below_.size() - 1 - l].share;
  }
  const int64_t n = int64_t(ids.size()), computed = n - p.hits - lower;
  hit_samples_ += p.hits;
  miss_samples_ += computed;
  lower_samples_ += lower;
  epoch_hits_ += p.hits;
  epoch_misses_ += computed;
  epoch_lower_ += lower;
  if (share > 0) epoch_lower_skipped_ += skipped / share;
  hit_batches_ += p.hits == n;
  fwd_flops_saved_sum_ += (double(p.hits) * share + skipped) / double(n);
  dropped_.peak_bytes_reserved = std::max(dropped_.peak_bytes_reserved, cache_stats().bytes_reserved);
  if (capture_.input_layer == k - 1) capture_.input = p.h;
  return model_.forward_layers(p.h, k, -1, k, &capture_);
}

int64_t FreezeRun::unit_input_layer(int64_t capture) const {
  if (!unit_scope_ || capture < 0) return -1;
  for (auto& u : part_.units())
    if (u.end - 1 == capture) return u.begin - 1;
  return -1;
}

void FreezeRun::prefetch(const std::vector<int64_t>& next_ids) {
  if (cache_ && frozen_layers() > 0 && settle_left_ == 0 && cache_->key() == generation_) cache_->prefetch(next_ids);
}

void FreezeRun::after_step(const freeze::StepInfo& s, double train_seconds) {
  flops_saved_sum_ += backward_saved_share();
  const auto t0 = std::chrono::steady_clock::now();
  if (lead_) {
    freeze::StepInfo si = s;
    si.x2 = host_x2_;
    // Readings are f32 whatever the training precision (16-bit activations under autocast),
    // widened where they are (no host round trip on a GPU: Note [Host syncs]).
    auto f32 = [](const Tensor& t) {
      if (!t.defined() || !is_half(t.dtype())) return t;
      Tensor w = Tensor::empty(t.shape(), DType::f32, t.device());
      ops::call(ops::cast, t, w);
      return w;
    };
    si.unit_input = f32(capture_.input);
    si.unit_scope = unit_scope_;
    for (auto& [layer, t] : capture_.more_output) si.captured_more[layer] = f32(t);
    const Tensor captured = f32(capture_.output);
    // The reference model reads the batch only with a capture (a reading's step).
    policy_->after_step(si, captured.defined() && host_x_ ? host_x_() : Tensor(), captured, model_);
  }
  capture_ = models::Capture();
  host_x_ = nullptr, host_x2_ = Tensor();
  if (recorder_) recorder_->after_step(s.step, s.lr);
  const int64_t prefix = frozen_layers();
  const double prefix_flops = prefix_share(unit_flops_);
  count_down_settling();
  std::vector<char> was_frozen;  // only where frozen batch norms settle
  if (bn_settle_ > 0)
    for (auto& [name, bn] : batch_norms_) was_frozen.push_back(bn->is_frozen());
  frozen_ = rank0s(lead_ ? policy_->frozen_units() : frozen_);
  if (freeze::apply_frozen_layers(model_, part_.layers_of(frozen_))) {
    if (bn_settle_ > 0) settle_batch_norms(was_frozen);
    if (frozen_layers() != prefix) {
      ++generation_;
      if (cache_) move_cache_boundary(prefix, prefix_flops);
    }
    dp_.average_running_stats(model_);
    json j = {{"type", "freeze"}, {"step", s.step}, {"epoch", s.epoch + 1}, {"train_seconds", train_seconds}};
    j.update(step_fields());
    if (lead_) append(metrics_, j);
  }
  if (lead_)
    for (auto& j : policy_->take_log()) {
      j["epoch"] = s.epoch + 1;
      append(log_, j);
    }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void FreezeRun::save(std::map<std::string, Tensor>& tensors, json& state) const {
  for (auto& [k, t] : policy_->state_tensors()) tensors["freeze/" + k] = t;
  if (recorder_) recorder_->save(tensors);
  state["freeze"] = policy_->state();
  state["freeze_units"] = part_.names();
  state["flops_saved_sum"] = flops_saved_sum_;
  state["freeze_seconds"] = seconds_;
  if (settle_left_ > 0) {
    json settling = json::object();
    for (auto& [name, bn] : batch_norms_)
      if (bn->settling >= 0) settling[name] = bn->settling;
    state["freeze_bn_settling"] = {{"steps_left", settle_left_}, {"batches", settling}};
  }
}

void FreezeRun::load(const std::map<std::string, Tensor>& tensors, const json& saved, const std::string& ckpt) {
  if (saved.contains("freeze_units"))
    EG_CHECK(saved["freeze_units"] == json(part_.names()), "--resume: '", ckpt,
             "' was trained with the freezing units ", saved["freeze_units"].dump(), ", this run makes ",
             json(part_.names()).dump(), "; use the same --freeze-modules / --freeze-module-regex");
  std::map<std::string, Tensor> fs;
  for (auto& [k, t] : tensors)
    if (k.rfind("freeze/", 0) == 0) fs[k.substr(7)] = t;
  if (lead_) {
    if (saved.contains("freeze")) policy_->load_state(saved["freeze"]);
    policy_->load_state_tensors(fs);
    if (recorder_) recorder_->load(tensors);
    frozen_ = policy_->frozen_units();
  }
  frozen_ = rank0s(frozen_);  // the policy's state is rank 0's alone
  freeze::apply_frozen_layers(model_, part_.layers_of(frozen_));
  const json settling = saved.value("freeze_bn_settling", json::object());  // none when nothing was settling
  settle_left_ = settling.value("steps_left", int64_t(0));
  const json batches = settling.value("batches", json::object());
  for (auto& [name, bn] : batch_norms_) bn->settling = batches.value(name, int64_t(-1));
  ++generation_;  // the cache starts empty after a resume: its file went with the process
  drop_below();
  flops_saved_sum_ = saved.value("flops_saved_sum", 0.0);
  seconds_ = saved.value("freeze_seconds", 0.0);
}

std::string freeze_report(const json& sj) {
  const std::string policy = sj.value("freeze", "none");
  if (policy == "none" || !sj.contains("freeze_units")) return "";
  const json& units = sj["freeze_units"];
  // The frozen set; a summary from before frozen sets says the number of front units.
  freeze::UnitSet set = sj.contains("frozen_units_final")
                            ? sj["frozen_units_final"].get<freeze::UnitSet>()
                            : freeze::first_units(sj.value("frozen_modules_final", int64_t(0)));
  const int64_t frozen = int64_t(set.size());
  // The last unit is the head, which never freezes.
  const int64_t freezable = std::max<int64_t>(0, int64_t(units.size()) - 1);
  std::string what;
  for (int64_t u : set)
    if (u < int64_t(units.size())) what += (what.empty() ? "" : ", ") + units[size_t(u)].value("name", "?");
  char buf[512];
  std::string r = "freezing (" + policy + "): ";
  if (frozen == 0) {
    std::snprintf(buf, sizeof buf, "frozen at the end: nothing (0 of %lld units)", (long long)freezable);
  } else {
    std::snprintf(buf, sizeof buf, " (%lld of %lld units, %.1f%% of the parameters)", (long long)frozen,
                  (long long)freezable, 100 * sj.value("frozen_fraction_final", 0.0));
    r += "frozen at the end: " + what;
  }
  r += buf;
  std::snprintf(buf, sizeof buf, "; backward FLOPs saved over the run %.1f%%",
                100 * sj.value("backward_flops_saved_fraction", 0.0));
  r += buf;
  const json st = sj.value("freeze_stats", json::object());
  if (st.contains("reference")) {
    std::snprintf(buf, sizeof buf,
                  "; %lld plasticity evaluations, n = %lld, %lld dropped; reference (%s, %s) overhead %.1f%%",
                  (long long)st.value("evaluations_completed", int64_t(0)), (long long)st.value("interval", int64_t(0)),
                  (long long)sj.value("evaluations_dropped", int64_t(0)), st.value("reference", "?").c_str(),
                  st.value("reference_scope", "?").c_str(), 100 * sj.value("reference_overhead_fraction", 0.0));
    r += buf;
  }
  return r;
}

double reference_overhead_fraction(double policy_seconds, double background_cpu_seconds, int training_threads,
                                   bool background_on_training_cores, double train_seconds,
                                   double reference_gpu_seconds) {
  if (train_seconds <= 0) return 0.0;
  const double bg = background_on_training_cores ? background_cpu_seconds / double(std::max(1, training_threads)) : 0.0;
  return (policy_seconds + bg + reference_gpu_seconds) / train_seconds;
}

void FreezeRun::summarize(json& sj, int64_t steps, double train_seconds) const {
  json st = policy_->stats();
  sj["frozen_fraction_final"] = frozen_share(unit_params_);
  sj["frozen_modules_final"] = int64_t(frozen_.size());
  sj["frozen_units_final"] = frozen_;
  sj["freeze_units"] = part_.to_json();
  sj["backward_flops_saved_fraction"] = steps > 0 ? flops_saved_sum_ / double(steps) : 0.0;
  sj["reference_overhead_fraction"] = reference_overhead_fraction(
      seconds_, st.value("reference_cpu_seconds", 0.0) + st.value("predictor_cpu_seconds", 0.0), num_threads(),
      reference_on_training_cores_, train_seconds, st.value("reference_gpu_seconds", 0.0));
  sj["evaluations_dropped"] = st.value("evaluations_dropped", int64_t(0));
  if (st.contains("reference")) st["reference_scope"] = unit_scope_ ? "unit" : "network";
  sj["freeze_stats"] = st;
  if (recorder_) {
    recorder_->write(out_dir_ + "/smartfrz-records.safetensors");
    sj["smartfrz_records"] = {{"records", recorder_->records()}, {"seconds", recorder_->seconds()}};
  }
  if (cache_) {
    const cache::CacheStats cs = cache_stats();
    // Forward FLOPs of the frozen prefix skipped thanks to the cache, as a share of the
    // steps' forward FLOPs (this invocation's steps: the cache does not survive a resume).
    sj["activation_cache"] = {
        {"hit_samples", hit_samples_},
        {"miss_samples", miss_samples_},
        {"lower_samples", lower_samples_},
        {"whole_batches_from_cache", hit_batches_},
        {"prefetched_batches", cs.prefetched},
        {"resets", cs.resets},
        {"bytes_reserved", cs.bytes_reserved},
        {"peak_bytes_reserved", cs.peak_bytes_reserved},
        {"on_disk", cs.ever_on_disk},
        {"forward_flops_saved_fraction", steps_ > 0 ? fwd_flops_saved_sum_ / double(steps_) : 0.0}};
  }
}

}  // namespace eg::train
