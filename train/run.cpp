#include "train/run.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "core/device.h"
#include "core/parallel.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/freezing.h"

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

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, models::Model& m) {
  if (c.optimizer == OptimizerKind::sgd)
    return std::make_unique<optim::SGD>(m.parameters(), c.lr,
                                        optim::SgdOptions{c.momentum, 0.0, c.weight_decay, c.nesterov});
  return std::make_unique<optim::AdamW>(m.parameters(), c.lr,
                                        optim::AdamWOptions{c.adam_beta1, c.adam_beta2, 1e-8, c.weight_decay});
}

// One step's progress: on a terminal, a bar with the epoch's mean loss, rate and ETA
// (redrawn in place); otherwise a plain line every --log-every steps.
void print_progress(const TrainConfig& c, int64_t epoch, int64_t done, int64_t total, int64_t step, double mean_loss,
                    double loss, double lr, double rate, const char* unit, double eta, bool tty) {
  if (tty) {
    std::printf("\repoch %lld/%lld [%-30s] %lld/%lld  loss %.4f  %.0f %s  ETA %s   ", (long long)epoch + 1,
                (long long)c.epochs, std::string(size_t(30 * done / std::max<int64_t>(total, 1)), '=').c_str(),
                (long long)done, (long long)total, mean_loss, rate, unit, human_time(eta).c_str());
  } else if (step % c.log_every == 0) {
    std::printf("epoch %lld step %lld  loss %.4f  lr %.4g  %.0f %s\n", (long long)epoch + 1, (long long)step, loss, lr,
                rate, unit);
  } else {
    return;
  }
  std::fflush(stdout);
}

// "test accuracy 91.23%  test loss 0.2345" for a split's metrics.
std::string metrics_text(Split s, const Metrics& m) {
  std::string t;
  char buf[96];
  for (auto& [k, v] : m) {
    if (k == "accuracy") std::snprintf(buf, sizeof buf, "%s accuracy %.2f%%", split_name(s), 100 * v);
    else if (k == "loss") std::snprintf(buf, sizeof buf, "%s loss %.4f", split_name(s), v);
    else std::snprintf(buf, sizeof buf, "%s %s %.2f", split_name(s), k.c_str(), v);
    t += (t.empty() ? "" : "  ") + std::string(buf);
  }
  return t;
}

double metric(const json& by_split, const char* split, const char* name, double otherwise = 0) {
  return by_split.contains(split) ? by_split[split].value(name, otherwise) : otherwise;
}

}  // namespace

Summary fit(Task& task, const TrainConfig& given) {
  validate(given);
  TrainConfig c = given;

  // ---- the process: device, threads, convolution algorithms (config.json records them)
  const Device dev = Device::parse(c.device);
  if (dev.is_cuda())
    EG_CHECK(
        cuda_available(), "--device ", c.device, ": ",
        built_with_cuda() ? "no CUDA GPU is visible" : "this build has no CUDA support (rebuild with -DEG_CUDA=ON)");
  set_num_threads(c.threads);
  c.threads = num_threads();
  if (c.cpu_winograd != Winograd::process) set_cpu_winograd(c.cpu_winograd == Winograd::on);
  c.cpu_winograd = cpu_winograd() ? Winograd::on : Winograd::off;

  // ---- the task's data and model; optimizer and schedule
  task.setup(c);
  models::Model& model = task.model();
  auto opt = make_optimizer(c, model);
  const int64_t spe = task.batches_per_epoch();
  EG_CHECK(spe > 0, "an epoch of this training set has no full batch of --batch-size ", c.batch_size);
  auto sched = make_schedule(c, spe);
  const int64_t total_steps = c.epochs * spe;
  json config = to_json(c);
  config.update(task.resolved());
  if (const std::string d = task.description(); !d.empty()) std::printf("%s\n", d.c_str());

  // ---- output directory, freezing state, resume
  make_dirs(c.out);
  const std::string metrics = c.out + "/metrics.jsonl";
  Checkpoints ckpts(c.out, c.keep_checkpoints, {"metrics.jsonl", "freeze.jsonl"});
  freeze::PolicyConfig pc = policy_config(c);
  task.configure_freezing(pc);
  pc.total_steps = total_steps;
  pc.steps_per_epoch = spe;
  pc.tracker.final_lr = sched->lr_at(std::max<int64_t>(total_steps - 1, 0));
  FreezeRun fr(c, model, pc, c.out);
  task.attach(fr);
  json state = {{"epoch", 0},
                {"batch", 0},
                {"step", 0},
                {"train_seconds", 0.0},
                {"samples", 0},
                {"epoch_loss_sum", 0.0},
                {"epoch_loss_n", 0},
                {"best_epoch", 0},
                {"best", json::object()},
                {"last", json::object()},
                {"time_to_target", -1.0}};
  if (c.resume && ckpts.any()) {
    Checkpoint ck = ckpts.load();
    check_resume(c, ck.config, spe, ck.state.value("step", int64_t(0)), ck.path);
    const json resolved = task.resolved();
    for (auto& [k, v] : resolved.items())
      EG_CHECK(ck.config.value(k, json()) == v, "--resume: '", ck.path, "' holds a run whose ", k, " is ",
               ck.config.value(k, json()).dump(), "; this run's is ", v.dump());
    TensorMap ms, os;
    for (auto& [k, t] : ck.tensors) {
      if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
      if (k.rfind("optim/", 0) == 0) os[k.substr(6)] = t;
    }
    model.load_state_dict(ms);
    opt->load_state_dict(os);
    fr.load(ck.tensors, ck.state, ck.path);
    task.generator().set_state(ck.state.at("rng_seed"), ck.state.at("rng_offset"));
    state.update(ck.state);
    ckpts.cut_logs(ck);  // checked and loaded: now the logs go back to this checkpoint
    std::printf("resuming %s from epoch %lld, batch %lld (step %lld)\n", ck.path.c_str(),
                (long long)state["epoch"].get<int64_t>() + 1, (long long)state["batch"].get<int64_t>(),
                (long long)state["step"].get<int64_t>());
  } else {
    if (c.resume) std::printf("--resume: no checkpoint in '%s' yet; starting from the beginning\n", c.out.c_str());
    ckpts.start_fresh();
  }
  write_file_atomic(c.out + "/config.json", config.dump(2) + "\n");

  int64_t step = state["step"], samples = state["samples"], this_run = 0;
  double train_secs = state["train_seconds"], loss_sum = state["epoch_loss_sum"];
  int64_t loss_n = state["epoch_loss_n"];
  auto save = [&](int64_t epoch, int64_t batch) {
    TensorMap all;
    for (auto& [k, t] : model.state_dict()) all["model/" + k] = t;
    for (auto& [k, t] : opt->state_dict()) all["optim/" + k] = t;
    fr.save(all, state);
    state["epoch"] = epoch, state["batch"] = batch, state["step"] = step;
    state["train_seconds"] = train_secs, state["samples"] = samples;
    state["epoch_loss_sum"] = loss_sum, state["epoch_loss_n"] = loss_n;
    state["rng_seed"] = task.generator().seed(), state["rng_offset"] = task.generator().offset();
    ckpts.save(all, state, config, step);
  };
  auto evaluate = [&](Split s) {
    autograd::NoGradGuard ng;
    model.eval();
    Metrics m = task.evaluate(s);
    model.train();
    return m;
  };

  // ---- training
  const std::string unit = task.unit(), rate_key = unit + "_per_second";
  const char* rate_unit = unit == "images" ? "img/s" : unit == "tokens" ? "tok/s" : "samples/s";
  const double target = c.target_accuracy > 1 ? c.target_accuracy / 100 : c.target_accuracy;
  const std::vector<Split> splits = task.epoch_splits();
  const bool tty = ::isatty(STDOUT_FILENO);
  Summary s;
  model.train();
  const int64_t start_epoch = state["epoch"], start_batch = state["batch"];
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    int64_t batch = epoch == start_epoch ? start_batch : 0, steps_here = 0;
    if (epoch != start_epoch) loss_sum = 0, loss_n = 0;
    task.start_epoch(epoch, batch);
    const auto t_epoch = Clock::now();
    while (task.next_batch()) {
      const auto t0 = Clock::now();
      const double lr = sched->lr_at(step);
      opt->set_lr(lr);
      StepOutput out = task.training_step(fr, fr.capture_layer(step));
      const double lv = out.loss.item();
      if (!std::isfinite(lv)) {
        append_json_line(metrics,
                         {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"loss", std::to_string(lv)}});
        EG_THROW("the training loss became ", lv, " at step ", step, " (epoch ", epoch + 1, ", batch ", batch,
                 "); stopped without saving. The last good checkpoint is ",
                 ckpts.any() ? "'" + ckpts.newest_path() + "'" : std::string("absent (none was written yet)"),
                 ". Try a lower --lr", c.warmup_steps > 0 ? " or a longer --warmup-steps." : ".");
      }
      opt->zero_grad();
      out.loss.backward();
      const double grad_norm = c.grad_clip > 0 ? opt->clip_grad_norm(c.grad_clip) : NAN;
      if (c.grad_clip > 0 && !std::isfinite(grad_norm)) {
        append_json_line(
            metrics,
            {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"grad_norm", std::to_string(grad_norm)}});
        EG_THROW("the gradient norm became ", grad_norm, " at step ", step, " (epoch ", epoch + 1,
                 "); stopped without saving. The last good checkpoint is ",
                 ckpts.any() ? "'" + ckpts.newest_path() + "'" : std::string("absent (none was written yet)"), ".");
      }
      opt->step();
      ++step, ++batch, ++this_run, ++steps_here, ++loss_n;
      fr.after_step({step, epoch, lr, lv, out.input2, Tensor()}, out.input, out.captured, train_secs);
      samples += out.samples;
      loss_sum += lv;
      train_secs += seconds_since(t0);
      const double rate = double(samples) / std::max(train_secs, 1e-9);
      if (step % c.log_every == 0) {
        json j = {{"type", "step"}, {"step", step}, {"epoch", epoch + 1},
                  {"loss", lv},     {"lr", lr},     {"train_seconds", train_secs},
                  {rate_key, rate}};
        if (c.grad_clip > 0) j["grad_norm"] = grad_norm;
        j.update(fr.step_fields());
        append_json_line(metrics, j);
      }
      const double eta = seconds_since(t_epoch) / double(steps_here) * double(spe - batch);
      print_progress(c, epoch, batch, spe, step, loss_sum / double(loss_n), lv, lr, rate, rate_unit, eta, tty);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) save(epoch, batch);
      if (c.stop_after_steps > 0 && this_run >= c.stop_after_steps) {
        s.steps = step;
        return s;  // as if killed here
      }
    }
    if (tty) std::printf("\n");

    // ---- the epoch's evaluation and the best epoch
    json line = {{"type", "epoch"},
                 {"epoch", epoch + 1},
                 {"step", step},
                 {"train_loss", loss_n ? loss_sum / double(loss_n) : NAN}};
    json by_split = json::object();
    std::string shown;
    for (Split sp : splits) {
      const Metrics m = evaluate(sp);
      for (auto& [k, v] : m) line[std::string(split_name(sp)) + "_" + k] = v, by_split[split_name(sp)][k] = v;
      shown += (shown.empty() ? "" : "  ") + metrics_text(sp, m);
    }
    line["lr"] = sched->lr_at(std::max<int64_t>(step - 1, 0));
    line["train_seconds"] = train_secs;
    line[rate_key] = double(samples) / std::max(train_secs, 1e-9);
    const char* sel_split = split_name(splits.front());
    EG_CHECK(by_split[sel_split].contains(task.selection_metric()), "the task's evaluation of the ", sel_split,
             " split has no \"", task.selection_metric(), "\", the metric that picks its best epoch");
    const double m = by_split[sel_split][task.selection_metric()],
                 best = metric(state["best"], sel_split, task.selection_metric().c_str());
    if (state["best_epoch"] == 0 || (task.higher_is_better() ? m > best : m < best)) {
      state["best_epoch"] = epoch + 1;
      state["best"] = by_split;
      if (splits.front() == Split::valid)
        save_safetensors(c.out + "/best.safetensors", model.state_dict(),
                         {{"model", c.model}, {"dataset", c.dataset}, {"epoch", std::to_string(epoch + 1)}});
    }
    if (target > 0 && metric(by_split, "test", "accuracy") >= target && state["time_to_target"].get<double>() < 0)
      state["time_to_target"] = train_secs;
    state["last"] = by_split;
    append_json_line(metrics, line);
    const Metrics best_m = {
        {task.selection_metric(), metric(state["best"], sel_split, task.selection_metric().c_str())}};
    std::printf("epoch %lld/%lld: %s  (best: epoch %lld, %s)  %s\n", (long long)epoch + 1, (long long)c.epochs,
                shown.c_str(), (long long)state["best_epoch"].get<int64_t>(),
                metrics_text(splits.front(), best_m).c_str(), human_time(train_secs).c_str());
    std::fflush(stdout);
    loss_sum = 0, loss_n = 0;
    save(epoch + 1, 0);
  }

  // ---- test (when not evaluated every epoch) and the summary
  json last = state["last"];
  if (!last.contains("test")) {
    const Metrics m = evaluate(Split::test);
    json line = {{"type", "test"}, {"step", step}};
    for (auto& [k, v] : m) line["test_" + k] = v, last["test"][k] = v;
    append_json_line(metrics, line);
    std::printf("%s\n", metrics_text(Split::test, m).c_str());
  }
  const json best = state["best"];
  const std::string sel_split = split_name(splits.front());
  json sj = {{"model", c.model},
             {"dataset", c.dataset},
             {"epochs", c.epochs},
             {"steps", step},
             {"train_seconds", train_secs},
             {rate_key, double(samples) / std::max(train_secs, 1e-9)},
             {"best_selected_on", sel_split},
             {"best_epoch", state["best_epoch"]},
             {"freeze", c.freeze}};
  const json final_test = last.value("test", json::object()), best_sel = best.value(sel_split, json::object());
  for (auto& [k, v] : final_test.items()) sj["final_test_" + k] = v;
  for (auto& [k, v] : best_sel.items()) sj["best_" + sel_split + "_" + k] = v;
  if (sel_split == "valid" && best.contains("test")) {
    const json at_best = best["test"];
    for (auto& [k, v] : at_best.items()) sj["test_" + k + "_at_best"] = v;
  }
  const double ttt = state["time_to_target"];
  sj["time_to_target_seconds"] = ttt < 0 ? json(nullptr) : json(ttt);
  task.summarize(sj);
  save_safetensors(c.out + "/model.safetensors", model.state_dict(), {{"model", c.model}, {"dataset", c.dataset}});
  fr.summarize(sj, step, train_secs);
  s.freeze_report = freeze_report(sj);
  write_file_atomic(c.out + "/summary.json", sj.dump(2) + "\n");

  s.completed = true;
  s.steps = step;
  s.train_seconds = train_secs;
  s.final_test_accuracy = metric(last, "test", "accuracy");
  s.final_test_loss = metric(last, "test", "loss");
  s.final_test_bleu = metric(last, "test", "bleu");
  s.best_epoch = state["best_epoch"];
  s.best_test_accuracy = metric(best, "test", "accuracy");
  s.best_valid_accuracy = metric(best, "valid", "accuracy");
  s.best_valid_loss = metric(best, "valid", "loss");
  s.best_valid_bleu = metric(best, "valid", "bleu");
  s.time_to_target_seconds = ttt;
  (unit == "tokens" ? s.tokens_per_second : s.images_per_second) = double(samples) / std::max(train_secs, 1e-9);
  return s;
}

}  // namespace eg::train
