// Data-parallel training under a real launcher (tests/dist_test.sh runs it under
// mpirun -np 2), through the library's fit() on MPI_COMM_WORLD:
// - equivalence: a tiny Transformer (dropout 0, SGD) on 2 ranks x batch 8 for 21 steps
//   (the last batch of one pair: rank 1's share is empty) against one process x batch 16
//   (run by rank 0 alone): the losses and every weight tensor agree to 1e-5 relative;
// - ResNet-20 with BatchNorm on 2 ranks: every rank ends with bit-identical weights and
//   running statistics, and the loss falls;
// - --freeze static and --freeze egeria on 2 ranks: the same frozen prefix at every step on
//   every rank, bit-identical weights, and each step's all-reduced bytes equal the
//   unfrozen parameters' bytes exactly;
// - --skip-bad-images: the samples left out are counted over both ranks, as one process does.
// Usage: eg_dist_train_check WORKDIR
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "tests/test_util.h"
#include "train/freezing.h"
#include "train/image_task.h"
#include "train/run.h"
#include "train/safetensors.h"
#include "train/translation_task.h"

using namespace eg;
using json = nlohmann::json;

namespace {

int passed = 0, failed = 0, rank = -1;
void check(bool ok, const std::string& what) {
  if (ok) return void(++passed);
  ++failed;
  std::printf("FAIL (rank %d): %s\n", rank, what.c_str());
  std::fflush(stdout);
}

std::vector<json> jsonl(const std::string& path, const std::string& type) {
  std::vector<json> v;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);)
    if (!l.empty() && json::parse(l).value("type", "") == type) v.push_back(json::parse(l));
  return v;
}

// Sentences of 2 to 6 words, so that a batch's shares pad to different lengths.
void write_corpus(const std::string& dir) {
  const char* en[] = {"cat", "dog", "house", "man", "bread", "water", "big", "small"};
  const char* es[] = {"gato", "perro", "casa", "hombre", "pan", "agua", "grande", "pequeno"};
  Generator g(3);
  for (auto [name, n] : {std::pair<const char*, int>{"train", 321}, {"valid", 12}, {"test", 12}}) {
    std::ofstream f(dir + "/" + std::string(name) + ".tsv");
    for (int i = 0; i < n; ++i) {
      const int words = 2 + int(g.next_u32() % 5);
      std::string a, b;
      for (int w = 0; w < words; ++w) {
        const int k = int(g.next_u32() % 8);
        a += std::string(w ? " " : "") + en[k];
        b += std::string(w ? " " : "") + es[k];
      }
      f << a << "\t" << b << "\n";
    }
  }
}

// The model's tensors (parameters and buffers) as bytes, for comparing ranks bit for bit.
std::string model_bytes(models::Model& m) {
  std::string s;
  for (auto& [k, t] : m.state_dict()) {
    Tensor c = t.to(Device::cpu()).clone();
    s += k;
    s.append(static_cast<const char*>(c.raw()), c.nbytes());
  }
  return s;
}

bool same_on_every_rank(dist::Communicator& w, const std::string& bytes) {
  const auto all = w.all_gather(bytes);
  for (auto& a : all)
    if (a != all[0]) return false;
  return true;
}

// The image task, recording the frozen prefix each step's forward ran with.
struct RecordingImageTask : train::ImageTask {
  std::vector<int64_t> frozen;  // layer modules under no-grad, a step each
  std::vector<freeze::UnitSet> sets;  // the frozen units, a step each
  train::StepOutput training_step(train::FreezeRun& fr) override {
    frozen.push_back(fr.frozen_layers());
    sets.push_back(fr.frozen_units());
    return ImageTask::training_step(fr);
  }
};

// tests/test_util.h's small image run, in global batches of 16 (8 on each rank).
train::TrainConfig image_config(const std::string& out) {
  train::TrainConfig c = eg::testing::small_image_run(out);
  c.batch_size = 8;  // per rank: 16 steps an epoch
  c.epochs = 2;
  c.milestones = {1};
  c.threads = 1;
  c.log_every = 1;
  return c;
}

void check_equivalence(dist::Communicator& w, const std::string& work) {
  const std::string data = work + "/corpus", two = work + "/tr2", one = work + "/tr1";
  if (rank == 0) {
    std::filesystem::create_directories(data);
    write_corpus(data);
  }
  w.barrier();
  models::TransformerConfig arch;
  arch.d_model = 32, arch.heads = 2, arch.ffn = 64, arch.enc_layers = arch.dec_layers = 1, arch.max_len = 32;
  arch.dropout = 0;
  train::TrainConfig c = train::default_config("transformer-tiny");
  c.data_dir = data;
  c.vocab_size = 48;
  c.max_len = 32;
  c.optimizer = train::OptimizerKind::sgd;
  c.lr = 0.1;
  c.momentum = 0.9;
  c.weight_decay = 0;
  c.lr_schedule = train::Schedule::constant;
  c.warmup_steps = 0;
  c.epochs = 1;  // 321 pairs in global batches of 16: 21 steps, the last of 1 pair (rank 1's share empty)
  c.threads = 1;
  c.log_every = 1;
  c.seed = 4;
  c.batch_size = 8;
  c.out = two;
  train::TranslationTask t2(arch);
  train::fit(t2, c, w);
  if (rank == 0) {
    auto local = dist::make_local();
    c.batch_size = 16;
    c.out = one;
    train::TranslationTask t1(arch);
    train::fit(t1, c, *local);
    const auto l2 = jsonl(two + "/metrics.jsonl", "step"), l1 = jsonl(one + "/metrics.jsonl", "step");
    check(l1.size() == 21 && l2.size() == 21,
          "21 steps each, got " + std::to_string(l1.size()) + " and " + std::to_string(l2.size()));
    double worst = 0;
    for (size_t i = 0; i < std::min(l1.size(), l2.size()); ++i) {
      const double a = l1[i]["loss"], b = l2[i]["loss"];
      worst = std::max(worst, std::abs(a - b) / std::abs(a));
    }
    check(worst <= 1e-5, "losses of 2 ranks x 8 and 1 x 16 differ by " + std::to_string(worst) + " relative");
    const auto w1 = train::load_safetensors(one + "/model.safetensors"),
               w2 = train::load_safetensors(two + "/model.safetensors");
    double worst_w = 0;
    for (auto& [k, a] : w1) {
      const auto it = w2.find(k);
      if (it == w2.end()) {
        check(false, "the 2-rank model lacks " + k);
        continue;
      }
      const auto x = a.to_vector<float>(), y = it->second.to_vector<float>();
      double d = 0, n = 0;
      for (size_t i = 0; i < x.size(); ++i) d += double(x[i] - y[i]) * (x[i] - y[i]), n += double(x[i]) * x[i];
      if (n > 0) worst_w = std::max(worst_w, std::sqrt(d / n));
    }
    std::printf("equivalence: losses within %.2g, weights within %.2g relative (21 steps)\n", worst, worst_w);
    check(worst_w <= 1e-5, "weights of 2 ranks x 8 and 1 x 16 differ by " + std::to_string(worst_w) + " relative");
    check(l1.front()["loss"].get<double>() > l1.back()["loss"].get<double>(), "the translation loss did not fall");
  }
  w.barrier();
}

void check_batchnorm(dist::Communicator& w, const std::string& work) {
  RecordingImageTask task;
  auto c = image_config(work + "/bn");
  train::fit(task, c, w);
  check(same_on_every_rank(w, model_bytes(task.model())), "ResNet-20's weights differ across ranks");
  if (rank == 0) {
    const auto steps = jsonl(c.out + "/metrics.jsonl", "step");
    check(steps.size() == 32, "32 steps, got " + std::to_string(steps.size()));
    double first = 0, last = 0;
    for (size_t i = 0; i < 4 && i + 4 <= steps.size(); ++i)
      first += steps[i]["loss"].get<double>(), last += steps[steps.size() - 1 - i]["loss"].get<double>();
    check(last < first, "the loss did not fall: " + std::to_string(first / 4) + " -> " + std::to_string(last / 4));
    const json sj = json::parse(std::ifstream(c.out + "/summary.json"));
    check(sj["world_size"] == 2 && sj["global_batch_size"] == 16 && sj["batch_size"] == 8,
          "summary's world and batch sizes: " + sj.dump());
  }
}

// --grad-sync-dtype bf16: the same run as check_batchnorm's with half the bytes sent, the
// ranks bit-identical, the first step's loss the f32 run's (no gradient has travelled yet)
// and the second's within bf16's rounding of the first step's gradients.
void check_bf16_sync(dist::Communicator& w, const std::string& work) {
  RecordingImageTask task;
  auto c = image_config(work + "/bf16-sync");
  c.grad_sync.dtype = DType::bf16;
  train::fit(task, c, w);
  check(same_on_every_rank(w, model_bytes(task.model())), "bf16 sync: the weights differ across ranks");
  if (rank == 0) {
    const auto f32 = jsonl(work + "/bn/metrics.jsonl", "step"), bf16 = jsonl(c.out + "/metrics.jsonl", "step");
    check(bf16.size() == 32 && f32.size() == 32, "bf16 sync: 32 steps");
    if (bf16.size() == 32 && f32.size() == 32) {
      check(bf16[0]["loss"] == f32[0]["loss"], "bf16 sync: the first step's loss differs from f32's");
      const double a = f32[1]["loss"], b = bf16[1]["loss"];
      check(std::abs(a - b) <= 1e-3 * std::abs(a),
            "bf16 sync: step 2's loss " + std::to_string(b) + " is not within 1e-3 of f32's " + std::to_string(a));
      check(bf16[0]["gradient_sync_bytes"].get<int64_t>() * 2 == f32[0]["gradient_sync_bytes"].get<int64_t>(),
            "bf16 sync: not half the bytes: " + bf16[0].dump() + " vs " + f32[0].dump());
      check(bf16.back()["loss"].get<double>() < bf16.front()["loss"].get<double>(), "bf16 sync: the loss did not fall");
    }
    const json sj = json::parse(std::ifstream(c.out + "/summary.json"));
    check(sj["gradient_sync_dtype"] == "bf16", "summary's gradient_sync_dtype: " + sj.dump());
  }
}

// Each step's all-reduced bytes are the unfrozen parameters' bytes, exactly. "static-set":
// units 1 and 3 frozen behind trainable ones (Note [Frozen sets]), whose bytes are not sent.
void check_freezing(dist::Communicator& w, const std::string& work, const std::string& policy) {
  RecordingImageTask task;
  auto c = image_config(work + "/" + policy);
  c.freezing.policy = policy == "static-set" ? "static" : policy;
  c.epochs = 4;
  c.milestones = {3};
  if (policy == "static") {
    c.freezing.static_modules = 2;
    c.freezing.static_epoch = 1;
  } else if (policy == "static-set") {
    c.freezing.static_units = {1, 3};
    c.freezing.static_epoch = 1;
  } else {
    eg::testing::use_fast_egeria(c);
  }
  train::fit(task, c, w);
  check(same_on_every_rank(w, json(task.sets).dump()), policy + ": the ranks froze differently");
  check(same_on_every_rank(w, model_bytes(task.model())), policy + ": the weights differ across ranks");
  int64_t most = 0;
  for (auto& set : task.sets) most = std::max(most, int64_t(set.size()));
  check(most > 0, policy + ": nothing froze");
  if (policy == "static-set")
    check(task.sets.back() == freeze::UnitSet{1, 3} && task.frozen.back() == 0,
          "static-set: units 1 and 3 frozen at the end, no prefix under no-grad: " + json(task.sets.back()).dump());
  if (rank != 0) return;
  const json sj = json::parse(std::ifstream(c.out + "/summary.json"));
  std::vector<int64_t> unit_params;
  int64_t total = 0;
  for (auto& u : sj["freeze_units"]) unit_params.push_back(u["params"]), total += u["params"].get<int64_t>();
  check(total == sj["parameters"].get<int64_t>(), "the units hold every parameter");
  const auto steps = jsonl(c.out + "/metrics.jsonl", "step");
  freeze::UnitSet frozen_units;
  int64_t checked = 0;
  for (auto& s : steps) {  // a line's frozen set is after its step; its bytes were sent with the one before
    int64_t expect = total;
    for (int64_t u : frozen_units) expect -= unit_params[size_t(u)];
    const int64_t got = s["gradient_sync_bytes"];
    if (got != expect * 4)
      check(false, policy + ": step " + s["step"].dump() + " sent " + std::to_string(got) + " bytes with units " +
                       json(frozen_units).dump() + " frozen, expected " + std::to_string(expect * 4));
    ++checked;
    frozen_units = s.contains("frozen_units") ? s["frozen_units"].get<freeze::UnitSet>()
                                              : freeze::first_units(s["frozen_modules"].get<int64_t>());
  }
  check(checked == int64_t(task.frozen.size()), policy + ": a step line per step");
  std::printf("%s: %lld steps, up to %lld units frozen; bytes per step %lld unfrozen, %lld at the end\n",
              policy.c_str(), (long long)checked, (long long)most, (long long)(total * 4),
              (long long)steps.back()["gradient_sync_bytes"].get<int64_t>());
}

// A user's samples, of which ids 3, 17 and 40 cannot be loaded (data::BadSample).
class SomeBad final : public data::SampleSource {
 public:
  explicit SomeBad(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 8, 8}; }
  int64_t label(int64_t id) const override { return id % 2; }
  void load(int64_t id, uint64_t, int64_t, float* out) const override {
    if (id == 3 || id == 17 || id == 40) throw data::BadSample("sample " + std::to_string(id) + " is damaged");
    for (int i = 0; i < 64; ++i) out[i] = float((id % 2) * 2 - 1) * float(i % 8) / 8.f;
  }
  int64_t n_;
};

// --skip-bad-images on 2 ranks: the samples left out over the run are summed over the
// ranks (each bad sample once an epoch, whichever rank's share holds it), as one process
// counts them, and training goes on with the shorter shares.
void check_skip_bad(dist::Communicator& w, const std::string& work) {
  auto run = [&](dist::Communicator& comm, const std::string& out, int64_t batch) {
    train::ImageData d;
    d.train = std::make_shared<SomeBad>(64);
    d.test = std::make_shared<SomeBad>(16);
    d.num_classes = 2;
    train::ImageTask task(d);
    train::TrainConfig c = image_config(out);
    c.batch_size = batch;
    c.dataset = "some-bad";
    c.train_limit = c.test_limit = 0;
    c.skip_bad_images = true;
    return train::fit(task, c, comm);
  };
  const train::Summary two = run(w, work + "/bad2", 8);
  check(two.completed, "skip-bad: the 2-rank run did not complete");
  if (rank != 0) return;
  auto local = dist::make_local();
  run(*local, work + "/bad1", 16);
  const json s2 = json::parse(std::ifstream(work + "/bad2/summary.json")),
             s1 = json::parse(std::ifstream(work + "/bad1/summary.json"));
  check(s2["images_left_out"] == 6,
        "skip-bad: 2 ranks left out " + s2["images_left_out"].dump() + " training samples over 2 epochs, expected 6");
  check(s1["images_left_out"] == s2["images_left_out"],
        "skip-bad: one process left out " + s1["images_left_out"].dump());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) {
      std::fprintf(stderr, "usage: eg_dist_train_check WORKDIR\n");
      return 2;
    }
    dist::Communicator& w = dist::world();
    rank = w.rank();
    check(w.size() == 2, "world size " + std::to_string(w.size()));
    const std::string work = argv[1];
    check_equivalence(w, work);
    check_batchnorm(w, work);
    check_bf16_sync(w, work);
    check_freezing(w, work, "static");
    check_freezing(w, work, "static-set");
    check_freezing(w, work, "egeria");
    check_skip_bad(w, work);
    std::printf("dist_train_check rank %d: %d passed, %d failed\n", rank, passed, failed);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_train_check (rank %d): error: %s\n", rank, e.what());
    dist::abort_job(1);
  }
}
