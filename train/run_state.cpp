#include "train/run_state.h"

#include "dist/grad_sync.h"
#include "optim/optimizer.h"
#include "train/freezing.h"

namespace eg::train {

using json = nlohmann::json;

TensorMap checkpoint_contents(RunParts& p, json& state, int64_t global_batch) {
  average_running_stats(p.model, p.comm);
  TensorMap all;
  for (auto& [k, t] : p.model.state_dict()) all["model/" + k] = t;
  for (auto& [k, t] : p.opt.state_dict()) all["optim/" + k] = t;
  p.freezing.save(all, state);
  p.task.save_state(state);
  Generator& g = p.task.generator();
  state["rng_seed"] = g.seed(), state["rng_offset"] = g.offset();
  state["world_size"] = p.comm.size(), state["global_batch_size"] = global_batch;
  state.erase("rng_ranks");  // a resume on another number of ranks leaves the old ranks' behind
  if (p.comm.size() > 1) {
    json ranks = json::array();
    for (auto& r : p.comm.all_gather(json::array({g.seed(), g.offset()}).dump())) ranks.push_back(json::parse(r));
    state["rng_ranks"] = ranks;
    if (p.sync) state["gradient_sync_bytes"] = p.sync->stats().bytes;
  }
  return all;
}

void restore_checkpoint(const Checkpoint& ck, RunParts& p, const TrainConfig& recorded, int64_t steps_per_epoch,
                        json& state) {
  check_resume(recorded, ck.config, steps_per_epoch, ck.state.value("step", int64_t(0)), ck.path);
  const json resolved = p.task.resolved();  // (items() of a temporary would dangle)
  for (auto& [k, v] : resolved.items())
    EG_CHECK(ck.config.value(k, json()) == v, "--resume: '", ck.path, "' holds a run whose ", k, " is ",
             ck.config.value(k, json()).dump(), "; this run's is ", v.dump());
  TensorMap ms, os;
  for (auto& [k, t] : ck.tensors) {
    if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
    if (k.rfind("optim/", 0) == 0) os[k.substr(6)] = t;
  }
  p.model.load_state_dict(ms);
  p.opt.load_state_dict(os);
  p.freezing.load(ck.tensors, ck.state, ck.path);
  p.task.load_state(ck.state);
  // Each rank's own dropout stream when the world size is the checkpoint's; otherwise rank
  // 0 continues the saved one and the others keep the fresh streams they were given.
  const json ranks = ck.state.value("rng_ranks", json::array());
  const int rank = p.comm.rank();
  if (ranks.size() == size_t(p.comm.size()))
    p.task.generator().set_state(ranks[size_t(rank)][0], ranks[size_t(rank)][1]);
  else if (rank == 0) p.task.generator().set_state(ck.state.at("rng_seed"), ck.state.at("rng_offset"));
  state.update(ck.state);
  if (p.sync) p.sync->set_bytes(state.value("gradient_sync_bytes", int64_t(0)));
}

}  // namespace eg::train
