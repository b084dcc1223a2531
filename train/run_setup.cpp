#include "train/run_setup.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/parallel.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, models::Model& m) {
  if (c.optimizer == OptimizerKind::sgd)
    return std::make_unique<optim::SGD>(m.parameters(), c.lr,
                                        optim::SgdOptions{c.momentum, 0.0, c.weight_decay, c.nesterov});
  return std::make_unique<optim::AdamW>(m.parameters(), c.lr,
                                        optim::AdamWOptions{c.adam_beta1, c.adam_beta2, 1e-8, c.weight_decay});
}

}  // namespace

void set_up_process(Run& r) {
  TrainConfig& c = r.c;
  c.device = r.dp.device().str();
  check_precision_on(r.dp.device(), c.precision);
  const int local_ranks = r.dp.comm().local_size(), cores = int(std::thread::hardware_concurrency());
  // On a GPU one thread enqueues the step's kernels; the rank's other cores decode and
  // augment (--workers 0), as a DataLoader's workers beside a GPU do.
  if (c.threads == 0 && r.dp.device().is_cuda()) c.threads = 1;
  if (c.threads == 0 && r.dp.size() > 1) {  // the machine's cores shared between its ranks (torchrun: 1 each)
    set_num_threads(0);  // the cores this process may run on (mpirun may bind it to some)
    c.threads = std::max(1, std::min(num_threads(), cores / local_ranks));
  }
  set_num_threads(c.threads);
  c.threads = num_threads();
  if (c.workers == 0)  // the loader decodes and augments on the cores training leaves this rank
    c.workers = std::max(1, cores / local_ranks - c.threads);
  if (c.cpu_winograd != Switch::process) set_cpu_winograd(c.cpu_winograd == Switch::on);
  c.cpu_winograd = cpu_winograd() ? Switch::on : Switch::off;
  if (c.tf32 != Switch::process) set_allow_tf32(c.tf32 == Switch::on);
  c.tf32 = allow_tf32() ? Switch::on : Switch::off;
}

// Note [A run directory is never overwritten]
// A run starting from the beginning in a directory that holds an earlier run's results
// (a checkpoint, model.safetensors, best.safetensors, summary.json) would have to delete
// them before its own first checkpoint, or its logs and the old checkpoints would be
// taken for one run's on a later --resume. Deleting them lost a user's work whenever the
// new run was not meant (a forgotten --resume), failed (a diverging learning rate, a
// bad flag found late) or was killed before its first checkpoint; and with --resume, a
// run whose checkpoint had been removed by hand started over its finished model. So the
// run refuses, on every rank, before anything in the directory is touched, as Hugging
// Face's Trainer refuses an output_dir that is not empty: the user continues the run
// (--resume), names another --out, or removes the directory. A directory left by a run
// killed before its first checkpoint (config.json and the logs only) is started over.
namespace {
void refuse_earlier_results(Run& r) {
  const std::vector<std::string> held = r.ckpts->results();
  Tensor any = Tensor::from_vector(std::vector<int64_t>{held.empty() ? 0 : 1}, {1});
  r.dp.comm().all_reduce(any, dist::ReduceOp::max);
  if (any.item() == 0) return;
  std::string names;
  for (const std::string& f : held) names += (names.empty() ? "" : ", ") + f;
  if (names.empty()) names = "seen by another rank";
  if (r.c.resume)
    EG_THROW("--resume: '", r.c.out, "' has no checkpoint to resume, but holds an earlier run's results (", names,
             "); nothing was changed: to train that run again from the beginning, remove them or the directory, "
             "or give another --out");
  EG_THROW("--out '", r.c.out, "' holds an earlier run (", names,
           "); nothing was changed: --resume continues it, and a new run needs another --out (or the directory "
           "removed first)");
}
}  // namespace

std::optional<Checkpoint> plan_resume(Run& r) {
  TrainConfig& c = r.c;
  r.ckpts = std::make_unique<Checkpoints>(c.out, c.keep_checkpoints,
                                          std::vector<std::string>{"metrics.jsonl", "freeze.jsonl"});
  Tensor found = Tensor::from_vector(std::vector<int64_t>{c.resume && r.ckpts->any() ? 1 : 0}, {1});
  Tensor seen = found.clone();
  r.dp.comm().all_reduce(found, dist::ReduceOp::max);
  r.dp.comm().all_reduce(seen, dist::ReduceOp::min);
  EG_CHECK(found.item() == seen.item(), "--resume: some ranks see a checkpoint in '", c.out,
           "' and others do not; --out must be on storage every rank reads");
  if (found.item() == 0) {
    refuse_earlier_results(r);
    return std::nullopt;
  }
  Checkpoint ck = r.ckpts->load();
  const int64_t W = r.dp.size(), saved_world = ck.state.value("world_size", int64_t(1));
  const int64_t saved_batch = ck.config.value("batch_size", c.batch_size), global = saved_batch * saved_world;
  if (saved_world != W) {
    EG_CHECK(global % W == 0, "--resume: '", ck.path, "' was trained on ", saved_world,
             " rank(s) with a global batch of ", global, " (", saved_world, " x --batch-size ", saved_batch,
             "), which ", W, " ranks cannot share evenly; resume on a number of ranks that divides ", global);
    if (r.lead())
      std::printf("resuming a run of %lld rank(s) on %lld: --batch-size %lld per rank keeps the global batch of %lld\n",
                  (long long)saved_world, (long long)W, (long long)(global / W), (long long)global);
    c.batch_size = global / W;
    ck.config["batch_size"] = c.batch_size;  // checked above; the other options as usual
  }
  return ck;
}

void build_run(Run& r, bool resuming) {
  const TrainConfig& c = r.c;
  r.task.setup(c, r.dp.comm());
  r.model = &r.task.model();
  if (!c.init_from.empty() && !resuming) {  // a resume takes the checkpoint's weights instead
    const InitFromReport rep = init_from(*r.model, c.init_from, {c.init_exclude, r.task.sample_shape()});
    if (r.lead()) std::printf("%s\n", rep.text(c.init_from).c_str());
  }
  if (r.dp.rank() > 0) r.task.generator().set_state(r.dp.rank_seed(c.seed), 0);
  r.opt = make_optimizer(c, *r.model);
  const size_t cap = size_t(c.bucket_cap_mb * double(1 << 20));
  r.opt->set_bucket_caps(cap, std::min(optim::kDefaultFirstBucketCap, cap));
  r.steps_per_epoch = r.task.batches_per_epoch();
  EG_CHECK(r.steps_per_epoch > 0, "an epoch of this training set has no full batch of --batch-size ", c.batch_size,
           r.dp.size() > 1 ? " x " + std::to_string(r.dp.size()) + " ranks" : std::string());
  r.sched = make_schedule(c, r.steps_per_epoch);
  r.config = to_json(r.as_recorded());
  r.config.update(r.task.resolved());
  if (const std::string d = r.task.description(); r.lead() && !d.empty()) std::printf("%s\n", d.c_str());
  if (const std::string d = r.dp.describe(c.batch_size, c.threads); r.lead() && !d.empty())
    std::printf("%s\n", d.c_str());

  if (r.lead()) {
    make_dirs(c.out);
    remove_stale_temporaries(c.out);
  }
  r.metrics = c.out + "/metrics.jsonl";
  freeze::PolicyConfig pc = policy_config(c);
  r.task.configure_freezing(pc);
  pc.total_steps = c.epochs * r.steps_per_epoch;
  pc.tracker.pretrained = !c.init_from.empty();
  pc.steps_per_epoch = r.steps_per_epoch;
  pc.tracker.final_lr = r.sched->lr_at(std::max<int64_t>(pc.total_steps - 1, 0));
  r.freezing = std::make_unique<FreezeRun>(c, *r.model, pc, c.out, r.dp);
  r.task.attach(*r.freezing);
  if (c.cuda_graphs) {  // Note [Graphed steps]; GraphedStep itself refuses several ranks
    EG_CHECK(r.task.graphable(), "--cuda-graphs on: this task's step is not captured as a CUDA graph");
    EG_CHECK(!c.freezing.cache,
             "--cuda-graphs on: --freeze-cache on keeps the batch on the host; use one or the other");
    const int64_t limit = c.cuda_graph_limit > 0 ? c.cuda_graph_limit : r.task.default_graph_limit();
    GraphedStep::Options go{3, c.grad_clip, [&r] { r.freezing->quiesce(); }, limit};
    r.graphed = std::make_unique<GraphedStep>(r.dp, *r.opt, &r.task.generator(), go);
  }
}

void start_or_resume(Run& r, std::optional<Checkpoint>& ck) {
  if (ck) {
    RunParts p = r.parts();
    r.state = restore_checkpoint(*ck, p, r.as_recorded(), r.steps_per_epoch);
    r.dp.comm().barrier();  // every rank has read the checkpoint before rank 0 touches the directory
    if (r.lead()) {
      r.ckpts->cut_logs(*ck);  // checked and loaded: now the logs go back to this checkpoint
      std::printf("resuming %s from epoch %lld, batch %lld (step %lld)\n", ck->path.c_str(),
                  (long long)r.state.epoch + 1, (long long)r.state.batch, (long long)r.state.step);
    }
    ck.reset();
  } else if (r.lead()) {
    if (r.c.resume) std::printf("--resume: no checkpoint in '%s' yet; starting from the beginning\n", r.c.out.c_str());
    r.ckpts->start_fresh();
  }
  if (r.lead()) write_file_atomic(r.c.out + "/config.json", r.config.dump(2) + "\n");
}

void save_checkpoint(Run& r) {
  settle_loss(r, false);
  RunParts p = r.parts();
  const CheckpointContents all = checkpoint_contents(p, r.state, r.c.batch_size * r.dp.size());
  if (r.lead()) r.ckpts->save(all.tensors, all.state, r.config, r.state.step);
}

}  // namespace eg::train
