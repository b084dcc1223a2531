// train/run: the one training loop. Runs of both tasks killed with SIGKILL at fixed
// points and resumed leave the files of an uninterrupted run (weights bit for bit, the
// logs line for line); a resume that changes the result is refused; the option table
// round-trips through config.json; older checkpoints are a fallback; --val-fraction
// picks the best epoch on held-out images.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/device.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;
using json = nlohmann::json;

namespace {

std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_run_" + name); }

std::vector<json> jsonl(const std::string& path) {
  std::vector<json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) v.push_back(json::parse(line));
  return v;
}

// A log's lines without the fields that measure time, which no two runs share.
std::vector<std::string> timeless(const std::string& path) {
  std::vector<std::string> v;
  for (json j : jsonl(path)) {
    for (auto it = j.begin(); it != j.end();) {
      const std::string k = it.key();
      const bool timed =
          k.size() > 8 && (k.rfind("_seconds") == k.size() - 8 || k.rfind("_per_second") == k.size() - 11);
      it = timed ? j.erase(it) : std::next(it);
    }
    v.push_back(j.dump());
  }
  return v;
}

int64_t step_lines(const std::string& metrics) {
  std::ifstream f(metrics);
  int64_t n = 0;
  for (std::string line; std::getline(f, line);) n += line.find("\"type\":\"step\"") != std::string::npos;
  return n;
}

// Starts tests/fit_main.cpp on a config.json, its output to DIR/log-<n>.txt.
pid_t spawn(const std::string& config, const std::string& dir, bool resume, int n = 0) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open((dir + "/log-" + std::to_string(n) + ".txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(EG_FIT_PATH, "eg_fit", config.c_str(), resume ? "--resume" : nullptr, nullptr);
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string write_config(const train::TrainConfig& c, const std::string& path, const json& extra = json::object()) {
  json j = train::to_json(c);
  j.update(extra);
  std::ofstream(path) << j.dump(2);
  return path;
}

// Trains the run of `config` (its out directory `out`), killed with SIGKILL as soon as
// metrics.jsonl holds k step lines, for each k, resuming after each kill; then resumes
// it to the end. Returns the number of steps each killed process had logged.
std::vector<int64_t> run_killed(const std::string& config, const std::string& out, const std::vector<int64_t>& kills) {
  std::vector<int64_t> seen;
  int n = 0;
  for (int64_t k : kills) {
    const pid_t pid = spawn(config, out, n > 0, n);
    ++n;
    int status = 0;
    for (;;) {
      if (step_lines(out + "/metrics.jsonl") >= k) break;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        ADD_FAILURE() << "the run ended (status " << status << ") before it logged " << k << " steps; see " << out
                      << "/log-" << n - 1 << ".txt";
        return seen;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status));
    seen.push_back(step_lines(out + "/metrics.jsonl"));
  }
  EXPECT_EQ(wait_exit(spawn(config, out, true, n)), 0) << "see " << out << "/log-" << n << ".txt";
  // The last process resumed (had it started over, the files would match all the same).
  const std::string log = eg::testing::slurp(out + "/log-" + std::to_string(n) + ".txt");
  EXPECT_NE(log.find("resuming " + out + "/checkpoint.safetensors from epoch"), std::string::npos) << log;
  return seen;
}

void expect_same_run(const std::string& a, const std::string& b) {
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k;
  for (const char* log : {"metrics.jsonl", "freeze.jsonl"}) {
    auto la = timeless(a + "/" + log), lb = timeless(b + "/" + log);
    ASSERT_EQ(la.size(), lb.size()) << log;
    for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << log << " line " << i + 1;
  }
}

// The freezing log up to the step the last kill came at: bootstrapping ended, 5+
// readings and a freeze, so the kills fell across every kind of freezing state.
void expect_freezing_before(const std::string& dir, int64_t step) {
  int64_t ends = 0, evaluations = 0, freezes = 0, checks_after = 0;
  for (auto& j : jsonl(dir + "/freeze.jsonl")) {
    if (j["step"].get<int64_t>() > step) break;
    ends += j["type"] == "refresh" && ends == 0;  // the reference is first built when bootstrapping ends
    checks_after += j["type"] == "bootstrap" && ends > 0;
    evaluations += j["type"] == "evaluation";
    freezes += j["type"] == "freeze";
  }
  EXPECT_EQ(ends, 1) << "bootstrapping did not end before step " << step;
  EXPECT_EQ(checks_after, 0) << "bootstrapping checks after the reference was built";
  EXPECT_GE(evaluations, 5);
  EXPECT_GE(freezes, 1);
}

// The trainer tests' run (tests/test_util.h) in 3 epochs, with Egeria deciding within it.
train::TrainConfig image_run(const std::string& out) {
  train::TrainConfig c = eg::testing::small_image_run(out);
  c.epochs = 3;
  c.milestones = {2};
  c.log_every = 1;
  c.checkpoint_every = 4;
  eg::testing::use_fast_egeria(c);
  return c;
}

// English -> Spanish in a toy lexicon (as test_translate.cpp), learnt by a tiny model.
void write_toy_corpus(const std::string& dir) {
  const char* en[] = {"cat", "dog", "house", "man", "bread", "water"};
  const char* es[] = {"gato", "perro", "casa", "hombre", "pan", "agua"};
  Generator g(11);
  for (auto [name, n] : {std::pair<const char*, int>{"train", 320}, {"valid", 8}, {"test", 8}}) {
    std::ofstream f(dir + "/" + std::string(name) + ".tsv");
    for (int i = 0; i < n; ++i) {
      const int a = int(g.next_u32() % 6), b = int(g.next_u32() % 6);
      f << "the " << en[a] << " sees the " << en[b] << "\tel " << es[a] << " ve el " << es[b] << "\n";
    }
  }
}

train::TrainConfig translation_run(const std::string& data, const std::string& out) {
  train::TrainConfig c = train::default_config("transformer-tiny");
  c.data_dir = data;
  c.out = out;
  c.vocab_size = 48;
  c.max_len = 32;
  c.batch_size = 32;  // 10 batches an epoch
  c.epochs = 5;  // the last kill at step 25 leaves 25 steps to spare
  c.lr = 5e-3;
  c.warmup_steps = 10;
  c.threads = 2;
  c.log_every = 1;
  c.seed = 4;
  c.checkpoint_every = 4;
  c.freezing.policy = "egeria";
  c.freezing.units = train::FreezeUnits::layers;
  c.freezing.reference.synchronous = true;
  c.freezing.tracker.interval = 1;
  c.freezing.tracker.bootstrap_interval = -1;
  c.freezing.tracker.window = 2;
  c.freezing.tracker.tolerance_coef = 0.5;  // the first unit freezes at step 13
  return c;
}

const json kTinyArch = {{"d_model", 32},   {"heads", 2},    {"ffn", 64},     {"enc_layers", 2},
                        {"dec_layers", 2}, {"max_len", 64}, {"dropout", 0.1}};

}  // namespace

TEST(Run, ImageRunKilledAnywhereAndResumedLeavesTheUninterruptedRunsFiles) {
  const std::string full = tmpdir("img_full"), killed = tmpdir("img_killed");
  ASSERT_EQ(wait_exit(spawn(write_config(image_run(full), full + "/run.json"), full, false)), 0);
  const auto seen = run_killed(write_config(image_run(killed), killed + "/run.json"), killed, {3, 9, 14, 22, 27, 31});
  ASSERT_EQ(seen.size(), 6u);
  expect_same_run(full, killed);
  expect_freezing_before(full, seen.back());
}

// The same under --precision bf16 (Note [Autocast]): autocast's casts and the weight
// cache leave nothing a resume would compute differently; Egeria decides on f32 readings
// (here the stem freezes at step 38, between the last two kills).
TEST(Run, Bf16ImageRunKilledAndResumedLeavesTheUninterruptedRunsFiles) {
  const std::string full = tmpdir("bf16_full"), killed = tmpdir("bf16_killed");
  auto bf16 = [](train::TrainConfig c) {
    c.precision = DType::bf16;
    return c;
  };
  ASSERT_EQ(wait_exit(spawn(write_config(bf16(image_run(full)), full + "/run.json"), full, false)), 0);
  const auto seen = run_killed(write_config(bf16(image_run(killed)), killed + "/run.json"), killed, {5, 18, 41});
  ASSERT_EQ(seen.size(), 3u);
  expect_same_run(full, killed);
  expect_freezing_before(full, seen.back());
  EXPECT_EQ(json::parse(eg::testing::slurp(full + "/summary.json"))["precision"], "bf16");
  // A resume of it in f32 is refused, naming the flag and both values.
  auto c = bf16(image_run(killed));
  c.resume = true;
  c.precision = DType::f32;
  try {
    train::run_training(c);
    ADD_FAILURE() << "a bf16 run was resumed in f32";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--precision bf16, not f32"), std::string::npos) << m;
  }
}

TEST(Run, TranslationRunKilledAnywhereAndResumedLeavesTheUninterruptedRunsFiles) {
  const std::string data = tmpdir("tr_data"), full = tmpdir("tr_full"), killed = tmpdir("tr_killed");
  write_toy_corpus(data);
  const json arch = {{"arch", kTinyArch}};
  ASSERT_EQ(wait_exit(spawn(write_config(translation_run(data, full), full + "/run.json", arch), full, false)), 0);
  const auto seen = run_killed(write_config(translation_run(data, killed), killed + "/run.json", arch), killed,
                               {3, 6, 11, 15, 19, 25});
  ASSERT_EQ(seen.size(), 6u);
  expect_same_run(full, killed);
  expect_freezing_before(full, seen.back());
}

// A resume with another value of an option that changes the result is refused, the
// option named with both values; one that may change (--log-every) is taken.
TEST(Run, ResumeRefusesAChangedLearningRateForEitherTask) {
  const std::string data = tmpdir("lr_data");
  write_toy_corpus(data);
  models::TransformerConfig arch;
  arch.d_model = 32, arch.heads = 2, arch.ffn = 64, arch.enc_layers = arch.dec_layers = 1, arch.max_len = 64;
  for (bool translation : {false, true}) {
    auto c = translation ? translation_run(data, tmpdir("lr_tr")) : image_run(tmpdir("lr_img"));
    c.freezing.policy = "none";
    c.checkpoint_every = 2;
    c.stop_after_steps = 3;  // the log one step past the checkpoint
    auto run = [&] { return translation ? train::run_translation(c, &arch) : train::run_training(c); };
    EXPECT_FALSE(run().completed);
    const std::string log = eg::testing::slurp(c.out + "/metrics.jsonl");
    c.resume = true;
    const double lr = c.lr;
    c.lr = lr * 2;
    try {
      run();
      ADD_FAILURE() << "a resume with another --lr was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--lr"), std::string::npos) << m;
      EXPECT_NE(m.find(json(lr).dump()), std::string::npos) << m;
    }
    EXPECT_EQ(eg::testing::slurp(c.out + "/metrics.jsonl"), log) << "a refused resume left the logs as they were";
    c.lr = lr;
    c.log_every = 3;
    c.stop_after_steps = 2;
    EXPECT_FALSE(run().completed) << "resumed, and stopped again after 2 steps";
    EXPECT_EQ(jsonl(c.out + "/metrics.jsonl").size(), 2u + 1u) << "cut to the checkpoint's 2 lines; step 3 logged anew";
  }
}

TEST(Run, EpochsGrowOnResumeOnlyWhereTheLearningRateSoFarStays) {
  auto c = image_run(tmpdir("extend"));
  c.freezing.policy = "none";
  c.epochs = 1;
  c.lr_schedule = train::Schedule::constant;
  ASSERT_TRUE(train::run_training(c).completed);
  c.resume = true;
  c.epochs = 2;
  ::testing::internal::CaptureStdout();
  auto s = train::run_training(c);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(s.completed);
  EXPECT_EQ(s.steps, 32);
  EXPECT_NE(out.find("from epoch 2, batch 0 (step 16)"), std::string::npos) << out;
  EXPECT_EQ(jsonl(c.out + "/metrics.jsonl").size(), 16u + 2u + 16u) << "the steps and epochs of both, once";
  c.epochs = 1;
  try {
    train::run_training(c);
    ADD_FAILURE() << "shrank a run below the steps it has taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than --epochs 1 holds"), std::string::npos) << e.what();
  }
  auto frozen = image_run(tmpdir("extend_freezing"));
  frozen.epochs = 1;
  frozen.lr_schedule = train::Schedule::constant;
  ASSERT_TRUE(train::run_training(frozen).completed);
  frozen.resume = true;
  frozen.epochs = 2;
  try {
    train::run_training(frozen);
    ADD_FAILURE() << "extended a freezing run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot change its length"), std::string::npos) << e.what();
  }
  c = image_run(tmpdir("extend_step"));
  c.freezing.policy = "none";
  c.milestones = {};  // half and three quarters of --epochs: the past depends on the length
  c.epochs = 2;
  ASSERT_TRUE(train::run_training(c).completed);
  c.resume = true;
  c.epochs = 4;
  try {
    train::run_training(c);
    ADD_FAILURE() << "extended a step schedule whose milestones move";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--epochs 2"), std::string::npos) << e.what();
  }
}

TEST(Run, ConfigJsonHoldsEveryOptionAndReadsBack) {
  const std::string d = tmpdir("config");
  auto c = image_run(d);
  c.freezing.cache_dir = d + "/cache";
  c.keep_checkpoints = 3;
  c.epochs = 1;
  c.train_limit = 64;
  c.tf32 = train::Switch::on;  // the process's switch, recorded (no effect on the CPU)
  ASSERT_TRUE(train::run_training(c).completed);
  EXPECT_TRUE(allow_tf32());
  set_allow_tf32(false);
  const json written = json::parse(std::ifstream(d + "/config.json"));
  for (auto& o : train::options())
    if (o.group != train::OptionGroup::hidden && o.key != "resume") {
      EXPECT_TRUE(written.contains(o.key)) << o.key;
    }
  EXPECT_EQ(written["threads"], 2);
  EXPECT_TRUE(written["cpu_winograd"] == "on" || written["cpu_winograd"] == "off") << "the choice made";
  EXPECT_EQ(written["tf32"], "on");
  EXPECT_EQ(written["freeze_cache_dir"], d + "/cache");
  EXPECT_EQ(train::to_json(train::from_json(written)), written);
  try {
    train::from_json({{"learning_rate", 0.1}});
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learning_rate"), std::string::npos) << e.what();
  }
}

// --keep-checkpoints 3: the newest three are on disk; with the newest unreadable a
// resume goes back to the one before, says so, and still ends as the uninterrupted run.
TEST(Run, ResumeFallsBackToAnOlderCheckpoint) {
  const std::string full = tmpdir("keep_full"), d = tmpdir("keep");
  auto c = image_run(full);
  c.freezing.policy = "none";
  c.epochs = 1;
  c.checkpoint_every = 2;
  c.keep_checkpoints = 3;
  ASSERT_TRUE(train::run_training(c).completed);
  c.out = d;
  c.stop_after_steps = 7;
  EXPECT_FALSE(train::run_training(c).completed);
  EXPECT_TRUE(std::ifstream(d + "/checkpoint-4.safetensors").good());
  EXPECT_TRUE(std::ifstream(d + "/checkpoint-2.safetensors").good());
  EXPECT_FALSE(std::ifstream(d + "/checkpoint-0.safetensors").good());
  const std::string newest = eg::testing::slurp(d + "/checkpoint.safetensors");
  std::ofstream(d + "/checkpoint.safetensors", std::ios::binary) << newest.substr(0, newest.size() / 2);
  c.resume = true;
  c.stop_after_steps = 0;
  ::testing::internal::CaptureStdout();
  const bool done = train::run_training(c).completed;
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(done);
  EXPECT_NE(out.find("resuming from the older checkpoint '" + d + "/checkpoint-4.safetensors'"), std::string::npos)
      << out;
  expect_same_run(full, d);
}

// Note [A run directory is never overwritten]: a new run over an earlier run's results,
// and a --resume that finds no checkpoint beside them, stop before touching anything.
TEST(Run, ANewRunNeverStartsOverAnEarlierRunsResults) {
  const std::string d = tmpdir("no_overwrite");
  auto c = image_run(d);
  c.freezing.policy = "none";
  c.epochs = 1;
  ASSERT_TRUE(train::run_training(c).completed);
  std::map<std::string, std::string> before;
  for (const char* f : {"model.safetensors", "summary.json", "metrics.jsonl", "config.json", "checkpoint.safetensors"})
    before[f] = eg::testing::slurp(d + "/" + f);
  auto unchanged = [&](const char* when) {
    for (auto& [f, bytes] : before) {
      EXPECT_EQ(eg::testing::slurp(d + "/" + f), bytes) << f << ", " << when;
    }
  };
  c.lr *= 2;  // a different run, as a user who forgot --resume might start
  std::string m = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(m.find("--out '" + d + "' holds an earlier run (checkpoint.safetensors, model.safetensors, summary.json"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("--resume continues it"), std::string::npos) << m;
  unchanged("after a new run was refused");

  std::remove((d + "/checkpoint.safetensors").c_str());
  before.erase("checkpoint.safetensors");
  c.resume = true;
  m = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(m.find("--resume: '" + d +
                   "' has no checkpoint to resume, but holds an earlier run's results "
                   "(model.safetensors, summary.json)"),
            std::string::npos)
      << m;
  unchanged("after a resume without a checkpoint was refused");

  // What a run killed before its first checkpoint leaves is started over.
  const std::string killed = tmpdir("no_overwrite_killed");
  std::ofstream(killed + "/config.json") << "{}\n";
  std::ofstream(killed + "/metrics.jsonl") << "{\"type\":\"killed-run\"}\n";
  c = image_run(killed);
  c.freezing.policy = "none";
  c.epochs = 1;
  ASSERT_TRUE(train::run_training(c).completed);
  for (const json& line : jsonl(killed + "/metrics.jsonl")) EXPECT_NE(line.value("type", ""), "killed-run");
  EXPECT_NE(eg::testing::slurp(killed + "/config.json"), "{}\n");
}

// A model whose evaluation loss is not finite while its training losses are (here its
// batch norms' running variances, which only evaluation reads) stops the run at the
// epoch's end, as a training loss would: named, and nothing of the epoch saved.
TEST(Run, ANonFiniteEvaluationLossStopsTheRunBeforeItSaves) {
  const std::string first = tmpdir("nan_eval_from"), d = tmpdir("nan_eval");
  auto c = eg::testing::small_image_run(first);
  c.freezing.policy = "none";
  c.epochs = 1;
  ASSERT_TRUE(train::run_training(c).completed);
  train::TensorMap w = train::load_safetensors(first + "/model.safetensors");
  int poisoned = 0;
  for (auto& [name, t] : w)
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".running_var") == 0) {
      t.data<float>()[0] = NAN;
      ++poisoned;
    }
  ASSERT_GT(poisoned, 0);
  train::save_safetensors(d + "/poisoned.safetensors", w);
  c.out = d + "/run";
  c.init_from = d + "/poisoned.safetensors";
  const std::string m = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(m.find("the test loss became nan at step 16 (epoch 1): the model's weights or batch-norm statistics are "
                   "no longer finite; stopped without saving"),
            std::string::npos)
      << m;
  for (const char* f : {"model.safetensors", "summary.json", "best.safetensors"})
    EXPECT_FALSE(std::ifstream(c.out + "/" + f).good()) << f;
  bool logged = false;
  for (const json& line : jsonl(c.out + "/metrics.jsonl")) logged = logged || line.value("type", "") == "error";
  EXPECT_TRUE(logged) << "the stop is in metrics.jsonl";
}

TEST(Run, ValidationSplitChoosesTheBestEpoch) {
  const std::string d = tmpdir("val");
  auto c = image_run(d);
  c.freezing.policy = "none";
  c.val_fraction = 0.25;
  ASSERT_TRUE(train::run_training(c).completed);
  const json sum = json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_EQ(sum["best_selected_on"], "valid");
  for (const char* k : {"best_valid_accuracy", "best_valid_loss", "test_accuracy_at_best", "final_test_accuracy"})
    EXPECT_TRUE(sum.contains(k)) << k;
  double best = -1;
  int64_t best_epoch = 0;
  for (auto& e : jsonl(d + "/metrics.jsonl"))
    if (e["type"] == "epoch") {
      EXPECT_TRUE(e.contains("valid_accuracy") && e.contains("test_accuracy")) << e.dump();
      if (e["valid_accuracy"].get<double>() > best) best = e["valid_accuracy"], best_epoch = e["epoch"];
    }
  EXPECT_EQ(sum["best_epoch"], best_epoch);
  EXPECT_EQ(sum["best_valid_accuracy"].get<double>(), best);
  EXPECT_TRUE(std::ifstream(d + "/best.safetensors").good());
  // 64 of the 256 images held out: 12 batches of 16 an epoch.
  EXPECT_EQ(sum["steps"], 3 * 12);
  c = image_run(tmpdir("noval"));
  c.freezing.policy = "none";
  c.epochs = 1;
  ASSERT_TRUE(train::run_training(c).completed);
  EXPECT_EQ(json::parse(std::ifstream(c.out + "/summary.json"))["best_selected_on"], "test");
  EXPECT_FALSE(std::ifstream(c.out + "/best.safetensors").good()) << "chosen on test, it is no model to pick";
}

TEST(Run, GradClipClipsTheNormAndLogsIt) {
  auto c = image_run(tmpdir("clip"));
  c.freezing.policy = "none";
  c.epochs = 1;
  c.train_limit = 64;
  c.grad_clip = 0.05;
  ASSERT_TRUE(train::run_training(c).completed);
  int64_t clipped = 0;
  for (auto& j : jsonl(c.out + "/metrics.jsonl"))
    if (j["type"] == "step") clipped += j.at("grad_norm").get<double>() > 0.05;
  EXPECT_GT(clipped, 0) << "no step's gradient norm was over 0.05";
  auto free_run = c;
  free_run.out = tmpdir("noclip");
  free_run.grad_clip = 0;
  ASSERT_TRUE(train::run_training(free_run).completed);
  EXPECT_NE(eg::testing::slurp(c.out + "/model.safetensors"), eg::testing::slurp(free_run.out + "/model.safetensors"));
  EXPECT_FALSE(jsonl(free_run.out + "/metrics.jsonl").front().contains("grad_norm"));
}
