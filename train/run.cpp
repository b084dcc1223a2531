#include "train/run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/parallel.h"
#include "dist/strategy.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/freezing.h"
#include "train/run_setup.h"

namespace eg::train {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string human_time(double s) {
  char buf[32];
  const int t = int(s);
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

const char* split_name(Split s) { return s == Split::valid ? "valid" : "test"; }

// "test accuracy 91.23%  test loss 0.2345" for a split's metrics.
std::string metrics_text(Split s, const Metrics& m) {
  std::string t;
  char buf[96];
  for (auto& [k, v] : m) {
    if (k == "accuracy") std::snprintf(buf, sizeof buf, "%s accuracy %.2f%%", split_name(s), 100 * v);
    else if (k == "loss") std::snprintf(buf, sizeof buf, "%s loss %.4f", split_name(s), v);
    else if (k == "images_left_out") std::snprintf(buf, sizeof buf, "(%s: %.0f images left out)", split_name(s), v);
    else std::snprintf(buf, sizeof buf, "%s %s %.2f", split_name(s), k.c_str(), v);
    t += (t.empty() ? "" : "  ") + std::string(buf);
  }
  return t;
}

// The weights files' safetensors metadata: the model, the dataset, the sample shape (images) and (image folders) its
// class names, as a JSON array, so that the weights say what their outputs mean.
Metadata weights_metadata(const Run& r, Metadata more = {}) {
  const TrainConfig& c = r.c;
  const json& config = r.config;
  more["model"] = c.model, more["dataset"] = c.dataset;
  if (const Shape s = r.task.sample_shape(); !s.empty())
    more["sample_shape"] = json(s).dump();  // --init-from checks it
  if (config.contains("classes")) more["classes"] = config["classes"].dump();
  return more;
}

std::string last_good_checkpoint(const Run& r) {
  return r.ckpts->any() ? "'" + r.ckpts->newest_path() + "'" : std::string("absent (none was written yet)");
}

// An evaluation's loss that is not finite: the weights or the batch norms' running
// statistics are, though every training loss was (a step's batch statistics can stay
// finite while the running ones overflow). Such a model is no result: the run stops as
// for a training loss, before this epoch's checkpoint, model or best epoch is written.
void check_evaluation(const Run& r, Split s, const Metrics& m) {
  const auto loss = m.find("loss");
  if (loss == m.end() || std::isfinite(loss->second)) return;
  const LoopState& st = r.state;
  r.log({{"type", "error"},
         {"step", st.step},
         {"epoch", st.epoch + 1},
         {std::string(split_name(s)) + "_loss", std::to_string(loss->second)}});
  EG_THROW("the ", split_name(s), " loss became ", loss->second, " at step ", st.step, " (epoch ", st.epoch + 1,
           "): the model's weights or batch-norm statistics are no longer finite; stopped without saving. The last "
           "good checkpoint is ",
           last_good_checkpoint(r), ". Try a lower --lr", r.c.warmup_steps > 0 ? " or a longer --warmup-steps." : ".");
}

Metrics evaluate(Run& r, Split s, bool loss_only = false) {
  autograd::NoGradGuard ng;
  autograd::Autocast ac(r.c.precision);
  r.dp.average_running_stats(*r.model);
  r.model->eval();
  Metrics m = loss_only ? r.task.evaluate_loss(s) : r.task.evaluate(s);
  r.model->train();
  check_evaluation(r, s, m);
  return m;
}

// The one stop for a non-finite loss or gradient norm: logged, and nothing saved.
// `step`, `epoch` and `batch`: the loop's counters when that step began.
[[noreturn]] void stop_not_finite(const Run& r, bool loss, double v, int64_t step, int64_t epoch, int64_t batch) {
  r.log({{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {loss ? "loss" : "grad_norm", std::to_string(v)}});
  EG_THROW("the ", loss ? "training loss" : "gradient norm", " became ", v, " at step ", step, " (epoch ", epoch + 1,
           ", batch ", batch, "); stopped without saving. The last good checkpoint is ", last_good_checkpoint(r),
           ". Try a lower --lr", r.c.warmup_steps > 0 ? " or a longer --warmup-steps." : ".");
}

const char* rate_unit(const std::string& unit) {
  return unit == "images" ? "img/s" : unit == "tokens" ? "tok/s" : "samples/s";
}

double rate(const LoopState& s) { return double(s.samples) / std::max(s.train_seconds, 1e-9); }

// One step's progress: on a terminal, a bar with the epoch's mean loss, rate and ETA
// (redrawn in place); otherwise a plain line every --log-every steps.
void print_progress(const Run& r, double loss, double lr, double eta) {
  const LoopState& s = r.state;
  const TrainConfig& c = r.c;
  const double mean_loss = s.epoch_loss_n ? s.epoch_loss_sum / double(s.epoch_loss_n) : loss;
  if (::isatty(STDOUT_FILENO)) {
    const int64_t total = r.steps_per_epoch;
    std::printf("\repoch %lld/%lld [%-30s] %lld/%lld  loss %.4f  %.0f %s  ETA %s   ", (long long)s.epoch + 1,
                (long long)c.epochs, std::string(size_t(30 * s.batch / std::max<int64_t>(total, 1)), '=').c_str(),
                (long long)s.batch, (long long)total, mean_loss, rate(s), rate_unit(r.task.unit()),
                human_time(eta).c_str());
  } else if (s.step % c.log_every == 0) {
    std::printf("epoch %lld step %lld  loss %.4f  lr %.4g  %.0f %s\n", (long long)s.epoch + 1, (long long)s.step, loss,
                lr, rate(s), rate_unit(r.task.unit()));
  } else {
    return;
  }
  std::fflush(stdout);
}

void log_step(const Run& r, const dist::StepResult& s, double lr, int64_t step) {
  const LoopState& st = r.state;
  const std::string unit = r.task.unit();
  json j = {{"type", "step"},
            {"step", step},
            {"epoch", st.epoch + 1},
            {"loss", s.loss},
            {"lr", lr},
            {"train_seconds", st.train_seconds},
            {unit + "_per_second", rate(st)}};
  j[unit] = s.count;  // this step's images or target tokens (of every rank)
  if (r.c.grad_clip > 0) j["grad_norm"] = s.grad_norm;
  if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale;
  if (s.skipped_overflow) j["skipped"] = "overflow";
  if (const dist::GradSync* sync = r.dp.sync()) j["gradient_sync_bytes"] = sync->stats().last_step_bytes;
  j.update(r.freezing->step_fields());
  r.log(j);
}

// --eval-every: the first split's loss between the steps (not training time).
void evaluate_between_steps(Run& r) {
  settle_loss(r, false);
  const Split sp = r.task.epoch_splits().front();
  const Metrics m = evaluate(r, sp, true);
  const LoopState& st = r.state;
  json j = {{"type", "eval"}, {"step", st.step}, {"epoch", st.epoch + 1}, {"train_seconds", st.train_seconds}};
  for (auto& [k, v] : m) j[std::string(split_name(sp)) + "_" + k] = v;
  if (m.count("loss")) j[std::string(split_name(sp)) + "_perplexity"] = std::exp(m.at("loss"));
  r.log(j);
}

// ---- --cuda-graphs on: the step through the batch shape's captured graph (Note [Graphed
// steps] in train/graphed_step.h); every graph is dropped when the frozen prefix changes
// or the task's graph inputs move. A step taking a plasticity reading runs eagerly (the
// host reads its captures). False for a step with no samples of this rank's, which takes
// the plain path.
bool graphed_step(Run& r, dist::StepResult& s) {
  const Task::GraphBatch b = r.task.stage_graph_batch();
  if (b.samples == 0) return false;
  const std::vector<int64_t> valid_for = {r.freezing->frozen_layers(), b.moves};
  if (valid_for != r.graphs_valid_for) r.graphed->reset(), r.graphs_valid_for = valid_for;
  auto forward = [&] {
    autograd::Autocast ac(r.c.precision);
    return r.task.graph_forward(*r.freezing).loss;
  };
  s = r.graphed->run(b.shape, forward, b.samples, r.freezing->reads_this_step());
  if (r.graphed->replayed_last()) r.freezing->note_replayed_forward();
  return true;
}

// ---- one training step: the task's forward through the freezing state, the strategy's
// backward and optimizer step, the freezing policy, the logs. False once
// --stop-after-steps has ended this invocation.
// `batch_syncs`: the host syncs of getting its batch (next_batch: a staged upload waiting
// for its buffer), which are the step's too.
bool train_step(Run& r, Clock::time_point epoch_start, int64_t& steps_this_epoch, int64_t batch_syncs) {
  LoopState& st = r.state;
  const auto t0 = Clock::now();
  const int64_t syncs0 = host_syncs() - batch_syncs;
  const double lr = r.sched->lr_at(st.step);
  r.opt->set_lr(lr);
  r.freezing->start_step(st.step);
  dist::StepResult s;
  if (!r.graphed || !graphed_step(r, s)) {
    r.task.generator().mark_step();  // Note [Random state on the device] in core/rng.h
    StepOutput out;
    {
      autograd::Autocast ac(r.c.precision);  // the forward and the loss; backward in the dtypes they recorded
      out = r.task.training_step(*r.freezing);
    }
    // No loss: this rank's share of the global batch is empty (data parallelism, or every
    // image of the batch left out by --skip-bad-images).
    EG_CHECK(out.loss.defined() || out.samples == 0, "the task gave no loss for step ", st.step);
    s = r.dp.step(out.loss, out.samples, *r.opt, st.step, r.c.grad_clip);
  }
  if (s.not_finite != dist::StepResult::NotFinite::none) {
    const bool loss = s.not_finite == dist::StepResult::NotFinite::loss;
    stop_not_finite(r, loss, loss ? s.loss : s.grad_norm, st.step, st.epoch, st.batch);
  }
  // The step before's loss, now that this step's kernels are queued behind it.
  settle_loss(r, true);
  Run::PendingLoss pending;
  pending.loss = s.loss_later, pending.grad_norm = s.grad_norm_later;
  pending.step = st.step, pending.epoch = st.epoch, pending.batch = st.batch, pending.trained = s.count > 0;
  pending.loss_scale = s.loss_scale_later, pending.overflow = s.overflow_later;
  pending.lr = lr, pending.logs = (st.step + 1) % r.c.log_every == 0, pending.count = s.count;
  r.pending = pending;
  ++st.step, ++st.batch, ++r.steps_this_run, ++steps_this_epoch;
  r.freezing->after_step({st.step, st.epoch, lr, s.loss_later, Tensor(), Tensor(), s.count > 0}, st.train_seconds);
  ++r.steps_by_host_syncs[host_syncs() - syncs0];  // the step's own, before any log, evaluation or checkpoint
  st.samples += s.count;
  if (!s.deferred) settle_loss(r, false);  // known already: nothing to wait for
  st.train_seconds += seconds_since(t0);
  if (st.step % r.c.log_every == 0 || s.skipped_overflow) {
    settle_loss(r, false);  // a log step reads its own loss
    if (s.deferred) s.loss = s.count > 0 ? r.last_loss : 0.0, s.grad_norm = r.last_grad_norm;
    if (s.overflow_later.defined()) s.loss_scale = r.last_loss_scale, s.skipped_overflow = r.last_overflow;
    log_step(r, s, lr, st.step);
  }
  const double eta = seconds_since(epoch_start) / double(steps_this_epoch) * double(r.steps_per_epoch - st.batch);
  if (r.lead()) print_progress(r, r.last_loss, lr, eta);
  if (r.c.eval_every > 0 && st.step % r.c.eval_every == 0) evaluate_between_steps(r);
  if (r.c.checkpoint_every > 0 && st.step % r.c.checkpoint_every == 0) save_checkpoint(r);
  return !(r.c.stop_after_steps > 0 && r.steps_this_run >= r.c.stop_after_steps);
}

// ---- an epoch's steps, from where the state says. False once --stop-after-steps ended
// this invocation (as if killed there).
bool train_epoch(Run& r) {
  r.task.start_epoch(r.state.epoch, r.state.batch);
  const auto t_epoch = Clock::now();
  int64_t steps_here = 0;
  // On a GPU what next_batch() counts is a staged upload's wait. On the CPU it stages
  // nothing, and what it counts (the batch's host tensors made "on the training device")
  // would be no copy in a GPU run: not the step's.
  const bool batch_syncs = !host_is_training_device();
  for (int64_t syncs = host_syncs(); r.task.next_batch(); syncs = host_syncs())
    if (!train_step(r, t_epoch, steps_here, batch_syncs ? host_syncs() - syncs : 0)) return false;
  if (r.lead() && ::isatty(STDOUT_FILENO)) std::printf("\n");
  return true;
}

// ---- the epoch's end: every split evaluated, the best epoch (best.safetensors with a
// validation split), the time to the target, the checkpoint.
void end_epoch(Run& r) {
  settle_loss(r, false);
  LoopState& st = r.state;
  const std::vector<Split> splits = r.task.epoch_splits();
  const std::string sel_split = split_name(splits.front()), sel = r.task.selection_metric();
  json line = {{"type", "epoch"},
               {"epoch", st.epoch + 1},
               {"step", st.step},
               {"train_loss", st.epoch_loss_n ? st.epoch_loss_sum / double(st.epoch_loss_n) : NAN}};
  SplitMetrics by_split;
  std::string shown;
  for (Split sp : splits) {
    const Metrics m = evaluate(r, sp);
    for (auto& [k, v] : m) line[std::string(split_name(sp)) + "_" + k] = v, by_split[split_name(sp)][k] = v;
    shown += (shown.empty() ? "" : "  ") + metrics_text(sp, m);
  }
  line["lr"] = r.sched->lr_at(std::max<int64_t>(st.step - 1, 0));
  line["train_seconds"] = st.train_seconds;
  line.update(r.freezing->epoch_fields());
  line[r.task.unit() + "_per_second"] = rate(st);
  EG_CHECK(by_split[sel_split].count(sel), "the task's evaluation of the ", sel_split, " split has no \"", sel,
           "\", the metric that picks its best epoch");
  const double m = by_split[sel_split][sel], best = metric(st.best, sel_split, sel);
  if (st.best_epoch == 0 || (r.task.higher_is_better() ? m > best : m < best)) {
    st.best_epoch = st.epoch + 1;
    st.best = by_split;
    if (r.lead() && splits.front() == Split::valid)
      save_safetensors(r.c.out + "/best.safetensors", r.model->state_dict(),
                       weights_metadata(r, {{"epoch", std::to_string(st.epoch + 1)}}));
  }
  const double target = r.c.target_accuracy > 1 ? r.c.target_accuracy / 100 : r.c.target_accuracy;
  if (target > 0 && metric(by_split, "test", "accuracy") >= target && st.time_to_target < 0)
    st.time_to_target = st.train_seconds;
  st.last = by_split;
  r.log(line);
  if (r.lead()) {
    std::printf("epoch %lld/%lld: %s  (best: epoch %lld, %s)  %s\n", (long long)st.epoch + 1, (long long)r.c.epochs,
                shown.c_str(), (long long)st.best_epoch,
                metrics_text(splits.front(), {{sel, metric(st.best, sel_split, sel)}}).c_str(),
                human_time(st.train_seconds).c_str());
    std::fflush(stdout);
  }
  ++st.epoch, st.batch = 0;
  st.epoch_loss_sum = 0, st.epoch_loss_n = 0;
  save_checkpoint(r);
}

// summary.json's fields of the loop's own: the run, the evaluations, the allocators.
json summary_json(const Run& r, const SplitMetrics& last) {
  const LoopState& st = r.state;
  const TrainConfig& c = r.c;
  const std::string sel_split = split_name(r.task.epoch_splits().front());
  json sj = {{"model", c.model},
             {"dataset", c.dataset},
             {"epochs", c.epochs},
             {"steps", st.step},
             {"train_seconds", st.train_seconds},
             {r.task.unit() + "_per_second", rate(st)},
             {"best_selected_on", sel_split},
             {"best_epoch", st.best_epoch},
             {"freeze", c.freezing.policy},
             {"precision", option("--precision").get(c)},
             {"world_size", r.dp.size()},
             {"batch_size", c.batch_size},
             {"global_batch_size", c.batch_size * r.dp.size()},
             {"machine", machine_json()},
             {"cpu_layout", cpu_layout_name(cpu_layout())}};
  r.dp.summarize(sj);
  if (r.graphed) {  // Note [Graphed steps]: graphs captured, and the steps that replayed one
    sj["cuda_graph_captures"] = r.graphed->captures();
    sj["cuda_graph_replayed_steps"] = r.graphed->replayed_steps();
    sj["cuda_graphs_held"] = r.graphed->graphs();
  }
  // Note [Host syncs]: this invocation's steady state (its most common count) and worst step.
  const auto mode = std::max_element(r.steps_by_host_syncs.begin(), r.steps_by_host_syncs.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  if (mode != r.steps_by_host_syncs.end()) {
    sj["host_syncs_per_step"] = mode->first;
    sj["host_syncs_per_step_max"] = r.steps_by_host_syncs.rbegin()->first;
  }
  if (auto t = last.find("test"); t != last.end())
    for (auto& [k, v] : t->second) sj["final_test_" + k] = v;
  if (auto b = st.best.find(sel_split); b != st.best.end())
    for (auto& [k, v] : b->second) sj["best_" + sel_split + "_" + k] = v;
  if (auto t = st.best.find("test"); sel_split == "valid" && t != st.best.end())
    for (auto& [k, v] : t->second) sj["test_" + k + "_at_best"] = v;
  sj["time_to_target_seconds"] = st.time_to_target < 0 ? json(nullptr) : json(st.time_to_target);
  const AllocatorStats host = cpu_allocator().stats();
  sj["host_tensor_bytes_peak"] = host.peak_allocated;  // the most held by tensors at once
  sj["host_tensor_bytes_reserved"] = host.reserved;  // held from the system at the end, the cache included
  sj["host_tensor_bytes_reserved_peak"] = host.peak_reserved;
  sj["host_allocator_system_allocs"] = host.system_allocs;  // requests the cache did not serve
  sj["host_allocator_cache_hits"] = host.cache_hits;
  if (r.dp.device().is_cuda()) {
    const AllocatorStats gpu = cuda_allocator(r.dp.device().index).stats();
    sj["device_tensor_bytes_peak"] = gpu.peak_allocated;
    sj["device_tensor_bytes_reserved"] = gpu.reserved;
    sj["device_tensor_bytes_reserved_peak"] = gpu.peak_reserved;
  }
  return sj;
}

// ---- the end: the test split (when not evaluated every epoch), model.safetensors and summary.json
Summary finish(Run& r) {
  settle_loss(r, false);
  const LoopState& st = r.state;
  SplitMetrics last = st.last;
  if (!last.count("test")) {
    const Metrics m = evaluate(r, Split::test);
    json line = {{"type", "test"}, {"step", st.step}};
    for (auto& [k, v] : m) line["test_" + k] = v, last["test"][k] = v;
    r.log(line);
    if (r.lead()) std::printf("%s\n", metrics_text(Split::test, m).c_str());
  }
  r.dp.average_running_stats(*r.model);
  json sj = summary_json(r, last);
  r.task.summarize(sj);
  r.freezing->summarize(sj, st.step, st.train_seconds);
  if (r.lead()) {
    save_safetensors(r.c.out + "/model.safetensors", r.model->state_dict(), weights_metadata(r));
    write_file_atomic(r.c.out + "/summary.json", sj.dump(2) + "\n");
  }
  Summary s;
  s.freeze_report = freeze_report(sj);
  s.completed = true;
  s.steps = st.step;
  s.train_seconds = st.train_seconds;
  s.final_test_accuracy = metric(last, "test", "accuracy");
  s.final_test_loss = metric(last, "test", "loss");
  s.final_test_bleu = metric(last, "test", "bleu");
  s.best_epoch = st.best_epoch;
  s.best_test_accuracy = metric(st.best, "test", "accuracy");
  s.best_valid_accuracy = metric(st.best, "valid", "accuracy");
  s.best_valid_loss = metric(st.best, "valid", "loss");
  s.best_valid_bleu = metric(st.best, "valid", "bleu");
  s.time_to_target_seconds = st.time_to_target;
  s.frozen_units_final = sj.value("frozen_modules_final", int64_t(0));
  s.backward_flops_saved_fraction = sj.value("backward_flops_saved_fraction", 0.0);
  (r.task.unit() == "tokens" ? s.tokens_per_second : s.images_per_second) = rate(st);
  return s;
}

}  // namespace

void settle_loss(Run& r, bool lagged) {
  if (!r.pending) return;
  const Run::PendingLoss p = std::move(*r.pending);
  r.pending.reset();
  auto read = [lagged](const DeferredScalar& d) { return lagged ? d.lagged_value() : d.value(); };
  const double v = read(p.loss);
  if (p.grad_norm.defined()) r.last_grad_norm = read(p.grad_norm);
  const bool overflow = p.overflow.defined() && read(p.overflow) != 0;
  if (p.overflow.defined()) r.last_overflow = overflow, r.last_loss_scale = read(p.loss_scale);
  if (!p.trained) return;  // no sample: no loss (not a loss of 0)
  if (!std::isfinite(v)) stop_not_finite(r, true, v, p.step, p.epoch, p.batch);
  // An overflowing step's gradients were not finite, and it was skipped (loss scaling).
  if (!overflow && !std::isfinite(r.last_grad_norm) && p.grad_norm.defined())
    stop_not_finite(r, false, r.last_grad_norm, p.step, p.epoch, p.batch);
  r.state.epoch_loss_sum += v, ++r.state.epoch_loss_n;
  r.last_loss = v;
  if (overflow && !p.logs) {  // a skipped step is always logged: this one a step late (its own numbers)
    dist::StepResult s;
    s.loss = v, s.grad_norm = r.last_grad_norm, s.loss_scale = r.last_loss_scale, s.skipped_overflow = true;
    s.count = p.count;
    log_step(r, s, p.lr, p.step + 1);
  }
}

Summary fit(Task& task, const TrainConfig& c) { return fit(task, c, dist::world()); }

// The recipe; each phase is a function above (Lightning's fit loop / epoch loop split).
Summary fit(Task& task, const TrainConfig& given, dist::Communicator& comm) {
  validate(given);
  Run r(task, given, comm);
  set_up_process(r);
  std::optional<Checkpoint> ck = plan_resume(r);
  build_run(r, ck.has_value());
  start_or_resume(r, ck);
  r.model->train();
  while (r.state.epoch < r.c.epochs) {
    if (!train_epoch(r)) {  // --stop-after-steps: as if killed here
      Summary s;
      s.steps = r.state.step;
      return s;
    }
    end_epoch(r);
  }
  return finish(r);
}

}  // namespace eg::train
