#include "train/run_state.h"

#include "optim/optimizer.h"
#include "train/freezing.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

json splits_json(const SplitMetrics& m) {
  json j = json::object();
  for (auto& [split, metrics] : m)
    for (auto& [k, v] : metrics) j[split][k] = v;
  return j;
}

SplitMetrics splits_from(const json& j) {
  SplitMetrics m;
  for (auto& [split, metrics] : j.items())
    for (auto& [k, v] : metrics.items()) m[split][k] = v.get<double>();
  return m;
}

}  // namespace

json LoopState::to_json() const {
  return {{"epoch", epoch},
          {"batch", batch},
          {"step", step},
          {"train_seconds", train_seconds},
          {"samples", samples},
          {"epoch_loss_sum", epoch_loss_sum},
          {"epoch_loss_n", epoch_loss_n},
          {"best_epoch", best_epoch},
          {"best", splits_json(best)},
          {"last", splits_json(last)},
          {"time_to_target", time_to_target}};
}

LoopState LoopState::from_json(const json& j) {
  LoopState s;
  s.epoch = j.value("epoch", int64_t(0));
  s.batch = j.value("batch", int64_t(0));
  s.step = j.value("step", int64_t(0));
  s.train_seconds = j.value("train_seconds", 0.0);
  s.samples = j.value("samples", int64_t(0));
  s.epoch_loss_sum = j.value("epoch_loss_sum", 0.0);
  s.epoch_loss_n = j.value("epoch_loss_n", int64_t(0));
  s.best_epoch = j.value("best_epoch", int64_t(0));
  s.best = splits_from(j.value("best", json::object()));
  s.last = splits_from(j.value("last", json::object()));
  s.time_to_target = j.value("time_to_target", -1.0);
  return s;
}

double metric(const SplitMetrics& m, const std::string& split, const std::string& name, double otherwise) {
  const auto s = m.find(split);
  if (s == m.end()) return otherwise;
  const auto v = s->second.find(name);
  return v == s->second.end() ? otherwise : v->second;
}

CheckpointContents checkpoint_contents(RunParts& p, const LoopState& loop, int64_t global_batch) {
  p.strategy.average_running_stats(p.model);
  CheckpointContents c;
  c.state = loop.to_json();
  for (auto& [k, t] : p.model.state_dict()) c.tensors["model/" + k] = t;
  for (auto& [k, t] : p.opt.state_dict()) c.tensors["optim/" + k] = t;
  p.freezing.save(c.tensors, c.state);
  p.task.save_state(c.state);
  Generator& g = p.task.generator();
  c.state["rng_seed"] = g.seed(), c.state["rng_offset"] = g.offset();
  c.state["world_size"] = p.strategy.size(), c.state["global_batch_size"] = global_batch;
  if (p.strategy.size() > 1) {
    json ranks = json::array();
    for (auto& r : p.strategy.comm().all_gather(json::array({g.seed(), g.offset()}).dump()))
      ranks.push_back(json::parse(r));
    c.state["rng_ranks"] = ranks;
  }
  p.strategy.save(c.state);
  return c;
}

LoopState restore_checkpoint(const Checkpoint& ck, RunParts& p, const TrainConfig& recorded, int64_t steps_per_epoch) {
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
  const int rank = p.strategy.rank();
  if (ranks.size() == size_t(p.strategy.size()))
    p.task.generator().set_state(ranks[size_t(rank)][0], ranks[size_t(rank)][1]);
  else if (rank == 0) p.task.generator().set_state(ck.state.at("rng_seed"), ck.state.at("rng_offset"));
  p.strategy.load(ck.state);
  return LoopState::from_json(ck.state);
}

}  // namespace eg::train
