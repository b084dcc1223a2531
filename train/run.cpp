#include "train/run.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/parallel.h"
#include "dist/grad_sync.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/freezing.h"
#include "train/run_state.h"

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
    else if (k == "images_left_out") std::snprintf(buf, sizeof buf, "(%s: %.0f images left out)", split_name(s), v);
    else std::snprintf(buf, sizeof buf, "%s %s %.2f", split_name(s), k.c_str(), v);
    t += (t.empty() ? "" : "  ") + std::string(buf);
  }
  return t;
}

double metric(const json& by_split, const char* split, const char* name, double otherwise = 0) {
  return by_split.contains(split) ? by_split[split].value(name, otherwise) : otherwise;
}

// The weights files' safetensors metadata: the model, the dataset and (image folders) its
// class names, as a JSON array, so that the weights say what their outputs mean.
Metadata weights_metadata(const TrainConfig& c, const json& config, Metadata more = {}) {
  more["model"] = c.model, more["dataset"] = c.dataset;
  if (config.contains("classes")) more["classes"] = config["classes"].dump();
  return more;
}

const char* nccl_note(Device dev) { return dev.is_cuda() ? ", gradients over NCCL" : ""; }

// A rank's own stream of dropout draws (rank 0's is the single-process run's).
uint64_t rank_seed(uint64_t seed, int rank) {
  return rank == 0 ? seed : seed ^ (0x9E3779B97F4A7C15ull * uint64_t(rank) + 0x72616e6bull);
}

}  // namespace

Summary fit(Task& task, const TrainConfig& c) { return fit(task, c, dist::world()); }

Summary fit(Task& task, const TrainConfig& given, dist::Communicator& comm) {
  validate(given);
  TrainConfig c = given;
  const int W = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;  // writes the files and prints

  // ---- the process: device, threads, convolution algorithms (config.json records them).
  // GPU ranks take one GPU each: cuda:<local rank> unless --device names one.
  if (W > 1 && c.device == "cuda") c.device = "cuda:" + std::to_string(comm.local_rank());
  const Device dev = Device::parse(c.device);
  if (dev.is_cuda())
    EG_CHECK(
        cuda_available(), "--device ", c.device, ": ",
        built_with_cuda() ? "no CUDA GPU is visible" : "this build has no CUDA support (rebuild with -DEG_CUDA=ON)");
  if (c.threads == 0 && W > 1) {  // the machine's cores shared between its ranks (torchrun: 1 each)
    set_num_threads(0);  // the cores this process may run on (mpirun may bind it to some)
    c.threads = std::max(1, std::min(num_threads(), int(std::thread::hardware_concurrency()) / comm.local_size()));
  }
  set_num_threads(c.threads);
  c.threads = num_threads();
  if (c.workers == 0)  // the loader decodes and augments on the cores training leaves this rank
    c.workers = std::max(1, int(std::thread::hardware_concurrency()) / comm.local_size() - c.threads);
  if (c.cpu_winograd != Winograd::process) set_cpu_winograd(c.cpu_winograd == Winograd::on);
  c.cpu_winograd = cpu_winograd() ? Winograd::on : Winograd::off;

  // ---- resume: every rank reads the checkpoint; its world size may change the per-rank batch
  Checkpoints ckpts(c.out, c.keep_checkpoints, {"metrics.jsonl", "freeze.jsonl"});
  std::optional<Checkpoint> ck;
  {
    Tensor found = Tensor::from_vector(std::vector<int64_t>{c.resume && ckpts.any() ? 1 : 0}, {1});
    Tensor seen = found.clone();
    comm.all_reduce(found, dist::ReduceOp::max);
    comm.all_reduce(seen, dist::ReduceOp::min);
    EG_CHECK(found.item() == seen.item(), "--resume: some ranks see a checkpoint in '", c.out,
             "' and others do not; --out must be on storage every rank reads");
    if (found.item() > 0) ck = ckpts.load();
  }
  if (ck) {
    const int64_t saved_world = ck->state.value("world_size", int64_t(1));
    const int64_t saved_batch = ck->config.value("batch_size", c.batch_size), global = saved_batch * saved_world;
    if (saved_world != W) {
      EG_CHECK(global % W == 0, "--resume: '", ck->path, "' was trained on ", saved_world,
               " rank(s) with a global batch of ", global, " (", saved_world, " x --batch-size ", saved_batch,
               "), which ", W, " ranks cannot share evenly; resume on a number of ranks that divides ", global);
      if (lead)
        std::printf("resuming a run of %lld rank(s) on %d: --batch-size %lld per rank keeps the global batch of %lld\n",
                    (long long)saved_world, W, (long long)(global / W), (long long)global);
      c.batch_size = global / W;
      ck->config["batch_size"] = c.batch_size;  // checked above; the other options as usual
    }
  }

  // ---- the task's data and model; optimizer and schedule
  task.setup(c, comm);
  models::Model& model = task.model();
  if (!c.init_from.empty() && !ck) {  // a resume takes the checkpoint's weights instead
    const InitFromReport r = init_from(model, c.init_from);
    if (lead) std::printf("%s\n", r.text(c.init_from).c_str());
  }
  if (rank > 0) task.generator().set_state(rank_seed(c.seed, rank), 0);
  auto opt = make_optimizer(c, model);
  opt->set_bucket_caps(size_t(c.bucket_cap_mb * double(1 << 20)),
                       std::min(optim::kDefaultFirstBucketCap, size_t(c.bucket_cap_mb * double(1 << 20))));
  const int64_t spe = task.batches_per_epoch();
  EG_CHECK(spe > 0, "an epoch of this training set has no full batch of --batch-size ", c.batch_size,
           W > 1 ? " x " + std::to_string(W) + " ranks" : std::string());
  auto sched = make_schedule(c, spe);
  const int64_t total_steps = c.epochs * spe;
  // config.json and the resume check see --device as given, not the GPU each rank took.
  auto as_recorded = [&] {
    TrainConfig r = c;
    r.device = given.device;
    return r;
  };
  json config = to_json(as_recorded());
  config.update(task.resolved());
  if (const std::string d = task.description(); lead && !d.empty()) std::printf("%s\n", d.c_str());
  if (lead && W > 1)
    std::printf(
        "data-parallel over %d ranks (%s%s): --batch-size %lld per rank, global batch %lld; %d threads per rank\n", W,
        comm.backend().c_str(), nccl_note(dev), (long long)c.batch_size, (long long)c.batch_size * W, c.threads);

  // ---- output directory, freezing state, resume
  if (lead) make_dirs(c.out);
  const std::string metrics = c.out + "/metrics.jsonl";
  freeze::PolicyConfig pc = policy_config(c);
  task.configure_freezing(pc);
  pc.total_steps = total_steps;
  pc.steps_per_epoch = spe;
  pc.tracker.final_lr = sched->lr_at(std::max<int64_t>(total_steps - 1, 0));
  FreezeRun fr(c, model, pc, c.out, comm);
  task.attach(fr);
  std::unique_ptr<dist::Communicator> nccl;  // GPU ranks' gradients go through NCCL
  if (W > 1 && dev.is_cuda()) nccl = dist::make_nccl(comm, dev);
  std::unique_ptr<dist::GradSync> sync;
  if (W > 1) sync = std::make_unique<dist::GradSync>(nccl ? *nccl : comm, c.grad_sync_overlap);
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
  RunParts parts{model, *opt, fr, task, comm, sync.get()};
  if (ck) {
    restore_checkpoint(*ck, parts, as_recorded(), spe, state);
    comm.barrier();  // every rank has read the checkpoint before rank 0 touches the directory
    if (lead) {
      ckpts.cut_logs(*ck);  // checked and loaded: now the logs go back to this checkpoint
      std::printf("resuming %s from epoch %lld, batch %lld (step %lld)\n", ck->path.c_str(),
                  (long long)state["epoch"].get<int64_t>() + 1, (long long)state["batch"].get<int64_t>(),
                  (long long)state["step"].get<int64_t>());
    }
    ck.reset();
  } else if (lead) {
    if (c.resume) std::printf("--resume: no checkpoint in '%s' yet; starting from the beginning\n", c.out.c_str());
    ckpts.start_fresh();
  }
  if (lead) write_file_atomic(c.out + "/config.json", config.dump(2) + "\n");

  int64_t step = state["step"], samples = state["samples"], this_run = 0;
  double train_secs = state["train_seconds"], loss_sum = state["epoch_loss_sum"];
  int64_t loss_n = state["epoch_loss_n"];
  auto save = [&](int64_t epoch, int64_t batch) {  // collective; rank 0 writes
    const TensorMap all = checkpoint_contents(parts, state, c.batch_size * W);
    state["epoch"] = epoch, state["batch"] = batch, state["step"] = step;
    state["train_seconds"] = train_secs, state["samples"] = samples;
    state["epoch_loss_sum"] = loss_sum, state["epoch_loss_n"] = loss_n;
    if (lead) ckpts.save(all, state, config, step);
  };
  auto evaluate = [&](Split s, bool loss_only = false) {
    autograd::NoGradGuard ng;
    average_running_stats(model, comm);
    model.eval();
    Metrics m = loss_only ? task.evaluate_loss(s) : task.evaluate(s);
    model.train();
    return m;
  };

  // ---- training
  const std::string unit = task.unit(), rate_key = unit + "_per_second";
  const char* rate_unit = unit == "images" ? "img/s" : unit == "tokens" ? "tok/s" : "samples/s";
  const double target = c.target_accuracy > 1 ? c.target_accuracy / 100 : c.target_accuracy;
  const std::vector<Split> splits = task.epoch_splits();
  const bool tty = lead && ::isatty(STDOUT_FILENO);
  Summary s;
  model.train();
  const int64_t start_epoch = state["epoch"], start_batch = state["batch"];
  // A test hook: EGERIA_TEST_FAIL=RANK:STEP makes that rank throw before that step (the
  // tests of a failed rank ending the job).
  long long fail_rank = -1, fail_step = -1;
  if (const char* f = std::getenv("EGERIA_TEST_FAIL"))
    EG_CHECK(std::sscanf(f, "%lld:%lld", &fail_rank, &fail_step) == 2, "EGERIA_TEST_FAIL must be RANK:STEP, got '", f,
             "'");
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    int64_t batch = epoch == start_epoch ? start_batch : 0, steps_here = 0;
    if (epoch != start_epoch) loss_sum = 0, loss_n = 0;
    task.start_epoch(epoch, batch);
    const auto t_epoch = Clock::now();
    while (task.next_batch()) {
      const auto t0 = Clock::now();
      const double lr = sched->lr_at(step);
      opt->set_lr(lr);
      if (fail_rank == rank && fail_step == step) EG_THROW("a test failure on rank ", rank, " at step ", step);
      StepOutput out = task.training_step(fr, fr.capture_layer(step));
      // No loss: this rank's share of the global batch is empty (data parallelism, or every
      // image of the batch left out by --skip-bad-images).
      EG_CHECK(out.loss.defined() || out.samples == 0, "the task gave no loss for step ", step);
      double lv = out.loss.defined() ? out.loss.item() : 0.0;
      int64_t count = out.samples;
      opt->zero_grad();
      Tensor loss = out.loss;
      if (W > 1) {  // the global mean: see Note [Data-parallel training]
        const dist::StepTotals t = dist::agree_on_step(comm, lv * double(out.samples), double(out.samples),
                                                       opt->grad_buckets().layout_hash(), step);
        lv = t.loss_sum / std::max(t.count, 1.0);
        count = int64_t(t.count);
        if (loss.defined()) loss = fn::scale(loss, double(out.samples) / std::max(t.count, 1.0));
      }
      if (!std::isfinite(lv)) {
        if (lead)
          append_json_line(metrics,
                           {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"loss", std::to_string(lv)}});
        EG_THROW("the training loss became ", lv, " at step ", step, " (epoch ", epoch + 1, ", batch ", batch,
                 "); stopped without saving. The last good checkpoint is ",
                 ckpts.any() ? "'" + ckpts.newest_path() + "'" : std::string("absent (none was written yet)"),
                 ". Try a lower --lr", c.warmup_steps > 0 ? " or a longer --warmup-steps." : ".");
      }
      if (sync) {
        sync->begin(opt->grad_buckets(), opt->params());
        sync->backward(loss);
        sync->finish();
      } else if (loss.defined()) {
        loss.backward();
      }
      const double grad_norm = c.grad_clip > 0 ? opt->clip_grad_norm(c.grad_clip) : NAN;
      if (c.grad_clip > 0 && !std::isfinite(grad_norm)) {
        if (lead)
          append_json_line(
              metrics,
              {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"grad_norm", std::to_string(grad_norm)}});
        EG_THROW("the gradient norm became ", grad_norm, " at step ", step, " (epoch ", epoch + 1,
                 "); stopped without saving. The last good checkpoint is ",
                 ckpts.any() ? "'" + ckpts.newest_path() + "'" : std::string("absent (none was written yet)"), ".");
      }
      if (count > 0) opt->step();  // a global batch whose every sample was left out trains nothing
      ++step, ++batch, ++this_run, ++steps_here;
      fr.after_step({step, epoch, lr, lv, out.input2, Tensor(), count > 0}, out.input, out.captured, train_secs);
      samples += count;
      if (count > 0) loss_sum += lv, ++loss_n;
      train_secs += seconds_since(t0);
      const double rate = double(samples) / std::max(train_secs, 1e-9);
      if (lead && step % c.log_every == 0) {
        json j = {{"type", "step"}, {"step", step}, {"epoch", epoch + 1},
                  {"loss", lv},     {"lr", lr},     {"train_seconds", train_secs},
                  {rate_key, rate}};
        j[unit] = count;  // this step's images or target tokens (of every rank)
        if (c.grad_clip > 0) j["grad_norm"] = grad_norm;
        if (sync) j["gradient_sync_bytes"] = sync->stats().last_step_bytes;
        j.update(fr.step_fields());
        append_json_line(metrics, j);
      }
      const double eta = seconds_since(t_epoch) / double(steps_here) * double(spe - batch);
      if (lead)
        print_progress(c, epoch, batch, spe, step, loss_n ? loss_sum / double(loss_n) : lv, lv, lr, rate, rate_unit,
                       eta, tty);
      if (c.eval_every > 0 && step % c.eval_every == 0) {  // between the steps: not training time
        const Metrics m = evaluate(splits.front(), true);
        json j = {{"type", "eval"}, {"step", step}, {"epoch", epoch + 1}, {"train_seconds", train_secs}};
        for (auto& [k, v] : m) j[std::string(split_name(splits.front())) + "_" + k] = v;
        if (m.count("loss")) j[std::string(split_name(splits.front())) + "_perplexity"] = std::exp(m.at("loss"));
        if (lead) append_json_line(metrics, j);
      }
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
      if (lead && splits.front() == Split::valid)
        save_safetensors(c.out + "/best.safetensors", model.state_dict(),
                         weights_metadata(c, config, {{"epoch", std::to_string(epoch + 1)}}));
    }
    if (target > 0 && metric(by_split, "test", "accuracy") >= target && state["time_to_target"].get<double>() < 0)
      state["time_to_target"] = train_secs;
    state["last"] = by_split;
    if (lead) {
      append_json_line(metrics, line);
      const Metrics best_m = {
          {task.selection_metric(), metric(state["best"], sel_split, task.selection_metric().c_str())}};
      std::printf("epoch %lld/%lld: %s  (best: epoch %lld, %s)  %s\n", (long long)epoch + 1, (long long)c.epochs,
                  shown.c_str(), (long long)state["best_epoch"].get<int64_t>(),
                  metrics_text(splits.front(), best_m).c_str(), human_time(train_secs).c_str());
      std::fflush(stdout);
    }
    loss_sum = 0, loss_n = 0;
    save(epoch + 1, 0);
  }

  // ---- test (when not evaluated every epoch) and the summary
  json last = state["last"];
  if (!last.contains("test")) {
    const Metrics m = evaluate(Split::test);
    json line = {{"type", "test"}, {"step", step}};
    for (auto& [k, v] : m) line["test_" + k] = v, last["test"][k] = v;
    if (lead) {
      append_json_line(metrics, line);
      std::printf("%s\n", metrics_text(Split::test, m).c_str());
    }
  }
  average_running_stats(model, comm);
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
             {"freeze", c.freeze},
             {"world_size", W},
             {"batch_size", c.batch_size},
             {"global_batch_size", c.batch_size * W}};
  if (sync) {
    const dist::GradSyncStats& gs = sync->stats();
    sj["gradient_sync_bytes"] = gs.bytes;  // this rank's, over the run
    sj["gradient_sync_bytes_per_step"] = gs.last_step_bytes;  // the last step's (freezing lowers it)
    sj["gradient_sync_wait_seconds"] = gs.wait_seconds;  // this invocation's
    sj["gradient_sync_overlap"] = c.grad_sync_overlap;
    sj["gradient_buckets_launched_in_backward"] = gs.buckets_launched_in_backward;
    sj["gradient_buckets_launched"] = gs.buckets;
  }
  const json final_test = last.value("test", json::object()), best_sel = best.value(sel_split, json::object());
  for (auto& [k, v] : final_test.items()) sj["final_test_" + k] = v;
  for (auto& [k, v] : best_sel.items()) sj["best_" + sel_split + "_" + k] = v;
  if (sel_split == "valid" && best.contains("test")) {
    const json at_best = best["test"];
    for (auto& [k, v] : at_best.items()) sj["test_" + k + "_at_best"] = v;
  }
  const double ttt = state["time_to_target"];
  sj["time_to_target_seconds"] = ttt < 0 ? json(nullptr) : json(ttt);
  const AllocatorStats host = cpu_allocator().stats();
  sj["host_tensor_bytes_peak"] = host.peak_allocated;  // the most held by tensors at once
  sj["host_tensor_bytes_reserved"] = host.reserved;  // held from the system at the end, the cache included
  sj["host_tensor_bytes_reserved_peak"] = host.peak_reserved;
  sj["host_allocator_system_allocs"] = host.system_allocs;  // requests the cache did not serve
  sj["host_allocator_cache_hits"] = host.cache_hits;
  if (dev.is_cuda()) {
    const AllocatorStats gpu = cuda_allocator(dev.index).stats();
    sj["device_tensor_bytes_peak"] = gpu.peak_allocated;
    sj["device_tensor_bytes_reserved"] = gpu.reserved;
    sj["device_tensor_bytes_reserved_peak"] = gpu.peak_reserved;
  }
  task.summarize(sj);
  fr.summarize(sj, step, train_secs);
  s.freeze_report = freeze_report(sj);
  if (lead) {
    save_safetensors(c.out + "/model.safetensors", model.state_dict(), weights_metadata(c, config));
    write_file_atomic(c.out + "/summary.json", sj.dump(2) + "\n");
  }

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
  s.frozen_units_final = sj.value("frozen_modules_final", int64_t(0));
  s.backward_flops_saved_fraction = sj.value("backward_flops_saved_fraction", 0.0);
  (unit == "tokens" ? s.tokens_per_second : s.images_per_second) = double(samples) / std::max(train_secs, 1e-9);
  return s;
}

}  // namespace eg::train
