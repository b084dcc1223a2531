// A training process for tests that kill one (tests/test_run.cpp, SIGKILL) or make one
// rank of several fail (tests/dist_train_test.sh): trains the run a config.json
// describes, as `egeria train --config FILE` does, and a Transformer with the
// architecture of the file's "arch" key when it has one (a tiny model no preset names).
// Usage: eg_fit CONFIG.json [--resume] [--fail-at RANK:STEP]
// --fail-at makes rank RANK throw before training step STEP (0-based, counted over the
// run, resumes included), through a task that wraps the run's own: the loop has no test
// hook of its own.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/communicator.h"
#include "models/transformer.h"
#include "train/trainer.h"

namespace {

using eg::train::Task;

// `inner` as it is, but for a throw on rank `rank` before the step numbered `step`.
class FailAt : public Task {
 public:
  FailAt(Task& inner, int rank, int64_t step) : inner_(inner), rank_(rank), step_(step) {}
  void setup(const eg::train::TrainConfig& c, eg::dist::Communicator& comm) override {
    here_ = comm.rank() == rank_;
    inner_.setup(c, comm);
  }
  eg::models::Model& model() override { return inner_.model(); }
  std::string description() const override { return inner_.description(); }
  nlohmann::json resolved() const override { return inner_.resolved(); }
  eg::Generator& generator() override { return inner_.generator(); }
  void configure_freezing(eg::freeze::PolicyConfig& pc) const override { inner_.configure_freezing(pc); }
  void attach(eg::train::FreezeRun& fr) override { inner_.attach(fr); }
  std::string unit() const override { return inner_.unit(); }
  int64_t batches_per_epoch() const override { return inner_.batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t first_batch) override {
    next_step_ = epoch * inner_.batches_per_epoch() + first_batch;
    inner_.start_epoch(epoch, first_batch);
  }
  bool next_batch() override { return inner_.next_batch(); }
  eg::train::StepOutput training_step(eg::train::FreezeRun& fr) override {
    if (here_ && next_step_ == step_) EG_THROW("a test failure on rank ", rank_, " at step ", step_);
    ++next_step_;
    return inner_.training_step(fr);
  }
  std::vector<eg::train::Split> epoch_splits() const override { return inner_.epoch_splits(); }
  eg::train::Metrics evaluate(eg::train::Split s) override { return inner_.evaluate(s); }
  eg::train::Metrics evaluate_loss(eg::train::Split s) override { return inner_.evaluate_loss(s); }
  std::string selection_metric() const override { return inner_.selection_metric(); }
  bool higher_is_better() const override { return inner_.higher_is_better(); }
  void summarize(nlohmann::json& j) const override { inner_.summarize(j); }
  void save_state(nlohmann::json& j) override { inner_.save_state(j); }
  void load_state(const nlohmann::json& j) override { inner_.load_state(j); }

 private:
  Task& inner_;
  const int rank_;
  const int64_t step_;
  bool here_ = false;
  int64_t next_step_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: eg_fit CONFIG.json [--resume] [--fail-at RANK:STEP]\n");
    return 2;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(argv[1]));
    eg::train::TrainConfig c = eg::train::from_json(j, {}, {"arch"});
    int fail_rank = -1;
    long long fail_step = -1;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--resume") == 0) c.resume = true;
      else if (std::strcmp(argv[i], "--fail-at") == 0 && i + 1 < argc)
        EG_CHECK(std::sscanf(argv[++i], "%d:%lld", &fail_rank, &fail_step) == 2, "--fail-at RANK:STEP, got '", argv[i],
                 "'");
      else EG_THROW("unknown argument '", argv[i], "'");
    }
    eg::models::TransformerConfig a;
    if (j.contains("arch")) {
      const auto& s = j["arch"];
      a.d_model = s.at("d_model"), a.heads = s.at("heads"), a.ffn = s.at("ffn"), a.max_len = s.at("max_len");
      a.enc_layers = s.at("enc_layers"), a.dec_layers = s.at("dec_layers"), a.dropout = s.at("dropout");
    }
    std::unique_ptr<Task> task = eg::train::make_task(c, j.contains("arch") ? &a : nullptr);
    if (fail_rank < 0) return eg::train::fit(*task, c).completed ? 0 : 1;
    FailAt failing(*task, fail_rank, fail_step);
    return eg::train::fit(failing, c).completed ? 0 : 1;
  } catch (const std::exception& e) {
    return eg::dist::fail_process("eg_fit", e);
  }
}
