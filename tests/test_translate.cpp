// train/translation_task: a small Transformer learns a toy translation task, writes the
// trainer's files, and a run killed and resumed ends with bit-identical weights.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/device.h"
#include "dist/communicator.h"
#include "dist/strategy.h"
#include "freeze/plasticity.h"
#include "kernels/ops.h"
#include "models/transformer.h"
#include "quant/reference.h"
#include "tests/test_util.h"
#include "train/freezing.h"
#include "train/safetensors.h"
#include "train/trainer.h"
#include "train/translation_task.h"

using namespace eg;

namespace {
std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_translate_" + name); }
using eg::testing::slurp;

// Word-for-word "English -> Spanish" over a small lexicon, with the adjective moved
// after its noun: learnable in a few hundred steps by a tiny model.
void write_toy_corpus(const std::string& dir) {
  const char* nouns_en[] = {"cat", "dog", "house", "man", "bread", "water"};
  const char* nouns_es[] = {"gato", "perro", "casa", "hombre", "pan", "agua"};
  const char* adj_en[] = {"big", "small", "red", "old"};
  const char* adj_es[] = {"grande", "pequeño", "rojo", "viejo"};
  const char* verb_en[] = {"sees", "eats", "has"};
  const char* verb_es[] = {"ve", "come", "tiene"};
  Generator g(11);
  auto pick = [&](int n) { return int(g.next_u32() % uint32_t(n)); };
  for (auto [name, n] : {std::pair<const char*, int>{"train", 400}, {"valid", 24}, {"test", 24}}) {
    std::ofstream f(dir + "/" + std::string(name) + ".tsv");
    for (int i = 0; i < n; ++i) {
      int n1 = pick(6), a1 = pick(4), v = pick(3), n2 = pick(6);
      f << "the " << adj_en[a1] << " " << nouns_en[n1] << " " << verb_en[v] << " the " << nouns_en[n2] << "\t"
        << "el " << nouns_es[n1] << " " << adj_es[a1] << " " << verb_es[v] << " el " << nouns_es[n2] << "\n";
    }
  }
}

models::TransformerConfig tiny_arch() {
  models::TransformerConfig a;
  a.d_model = 32;
  a.heads = 2;
  a.ffn = 64;
  a.enc_layers = a.dec_layers = 1;
  a.max_len = 64;
  a.dropout = 0.1;
  return a;
}

train::TrainConfig toy_run(const std::string& data, const std::string& out) {
  train::TrainConfig c = train::default_config("transformer-tiny");
  c.data_dir = data;
  c.out = out;
  c.vocab_size = 64;
  c.max_len = 32;
  c.batch_size = 32;
  c.epochs = 16;
  c.lr = 5e-3;
  c.warmup_steps = 20;
  c.threads = 2;
  c.log_every = 1;
  c.seed = 4;
  return c;
}

std::vector<nlohmann::json> records(const std::string& path, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) v.push_back(j);
  }
  return v;
}
}  // namespace

TEST(Translate, TransformerDefaultsLeaveImageDefaultsAlone) {
  auto t = train::default_config("transformer-base");
  EXPECT_EQ(t.optimizer, train::OptimizerKind::adamw);
  EXPECT_EQ(t.lr_schedule, train::Schedule::inverse_sqrt);
  EXPECT_EQ(t.warmup_steps, 4000);
  EXPECT_EQ(t.dataset, "en-es");
  EXPECT_DOUBLE_EQ(t.adam_beta2, 0.98);
  EXPECT_EQ(train::default_config("transformer-tiny").warmup_steps, 1000);
  train::TrainConfig given;
  given.model = "transformer-tiny";
  given.lr = 1e-3;
  train::apply_model_defaults(given, {"--lr"});
  EXPECT_DOUBLE_EQ(given.lr, 1e-3);  // set by the user: kept
  EXPECT_EQ(given.optimizer, train::OptimizerKind::adamw);
  auto img = train::default_config("resnet20"), plain = train::TrainConfig();
  EXPECT_EQ(img.optimizer, plain.optimizer);
  EXPECT_DOUBLE_EQ(img.lr, plain.lr);
  EXPECT_EQ(img.dataset, plain.dataset);
}

TEST(Translate, LearnsAToyTaskAndWritesItsFiles) {
  std::string data = tmpdir("data"), out = tmpdir("run");
  write_toy_corpus(data);
  const auto arch = tiny_arch();
  auto s = train::run_translation(toy_run(data, out), &arch);
  ASSERT_TRUE(s.completed);
  EXPECT_TRUE(std::ifstream(data + "/spm-64.model").good()) << "the tokenizer is kept beside the data";
  for (const char* f : {"config.json", "metrics.jsonl", "summary.json", "model.safetensors", "checkpoint.safetensors"})
    EXPECT_TRUE(std::ifstream(out + "/" + f).good()) << f;
  auto sum = nlohmann::json::parse(slurp(out + "/summary.json"));
  for (const char* k : {"model", "dataset", "epochs", "final_test_bleu", "final_test_loss", "best_valid_bleu",
                        "train_seconds", "tokens_per_second", "time_to_target_seconds"})
    EXPECT_TRUE(sum.contains(k)) << k;
  EXPECT_TRUE(sum["time_to_target_seconds"].is_null());
  EXPECT_GT(sum["tokens_per_second"].get<double>(), 0);
  // A steady-state step waits for nothing: the batch's ids staged (Note [Staged uploads]),
  // the padding masks made where the ids are, the loss read behind the next step.
  EXPECT_EQ(sum["host_syncs_per_step"], 0) << sum.dump();

  auto steps = records(out + "/metrics.jsonl", "step"), epochs = records(out + "/metrics.jsonl", "epoch");
  ASSERT_EQ(epochs.size(), 16u);
  ASSERT_GT(steps.size(), 100u);
  double first = 0, last = 0;
  for (size_t i = 0; i < 5; ++i) first += steps[i]["loss"].get<double>() / 5;
  for (size_t i = steps.size() - 5; i < steps.size(); ++i) last += steps[i]["loss"].get<double>() / 5;
  EXPECT_LT(last, 0.6 * first) << "training loss " << first << " -> " << last;
  EXPECT_LT(epochs.back()["valid_loss"].get<double>(), 0.5 * epochs[0]["valid_loss"].get<double>());
  for (auto& e : epochs) {
    EXPECT_GE(e["valid_bleu"].get<double>(), 0);
    EXPECT_LE(e["valid_bleu"].get<double>(), 100);
  }
  // Greedy translations of unseen sentences: the task is learnt (it reaches ~95 BLEU).
  EXPECT_GT(s.best_valid_bleu, 50);
  EXPECT_GT(s.final_test_bleu, 50);
  EXPECT_EQ(sum["best_valid_bleu"].get<double>(), s.best_valid_bleu);

  auto ev = train::evaluate_checkpoint(out, "", 0);
  EXPECT_TRUE(ev.translation);
  EXPECT_NEAR(ev.loss, s.final_test_loss, 1e-5);
  EXPECT_NEAR(ev.bleu, s.final_test_bleu, 1e-9);
  // The int8 reference model Egeria would build from it (every Linear dynamically
  // quantised) translates about as well.
  auto ev8 = train::evaluate_checkpoint(out, "", 0, "int8");
  EXPECT_TRUE(ev8.translation);
  EXPECT_GT(ev8.bleu, s.final_test_bleu - 10) << "int8 BLEU " << ev8.bleu << " vs fp32 " << s.final_test_bleu;
  EXPECT_NEAR(ev8.loss, s.final_test_loss, 0.1 * s.final_test_loss + 0.05);
}

TEST(Translate, KilledAndResumedRunIsBitIdentical) {
  std::string data = tmpdir("data_resume"), a = tmpdir("full"), b = tmpdir("killed");
  write_toy_corpus(data);
  const auto arch = tiny_arch();  // dropout 0.1: the generator's state must be restored too
  auto c = toy_run(data, a);
  c.epochs = 2;
  c.train_limit = 160;  // 5 batches per epoch
  c.test_limit = 8;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);

  // Killed at step 3 (mid-epoch 1), then at step 7 (mid-epoch 2), resumed each time.
  c.out = b;
  c.checkpoint_every = 1;
  c.stop_after_steps = 3;
  EXPECT_FALSE(train::run_translation(c, &arch).completed);
  c.resume = true;
  c.stop_after_steps = 4;
  EXPECT_FALSE(train::run_translation(c, &arch).completed);
  c.stop_after_steps = 0;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k;
  auto ea = records(a + "/metrics.jsonl", "epoch"), eb = records(b + "/metrics.jsonl", "epoch");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_EQ(ea[i]["train_loss"], eb[i]["train_loss"]) << "epoch " << i + 1;

  // Another architecture cannot resume this checkpoint.
  auto wider = arch;
  wider.d_model = 48;
  try {
    train::run_translation(c, &wider);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
}

// Egeria on a Transformer (Note [Freezing a Transformer]): evaluations against the
// int8 reference (dynamically quantised linear layers), decisions logged, the summary's
// freezing figures, and a killed run resumed to the same weights and decisions.
TEST(Translate, EgeriaFreezesATransformerAndResumesBitIdentically) {
  std::string data = tmpdir("data_freeze"), a = tmpdir("freeze_full"), b = tmpdir("freeze_killed");
  write_toy_corpus(data);
  auto arch = tiny_arch();
  arch.enc_layers = arch.dec_layers = 2;
  auto c = toy_run(data, a);
  c.epochs = 3;
  c.train_limit = 320;  // 10 batches per epoch
  c.test_limit = 8;
  c.freezing.policy = "egeria";
  c.freezing.units = train::FreezeUnits::layers;
  c.freezing.reference.synchronous = true;
  c.freezing.tracker.interval = 1;
  c.freezing.tracker.bootstrap_interval = -1;  // every n, the paper
  c.freezing.tracker.window = 2;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);
  auto log = records(a + "/freeze.jsonl", "evaluation");
  EXPECT_GT(log.size(), 3u) << "no plasticity evaluations in 30 steps with n=1";
  for (auto& e : log) {  // SP loss of row-normalised Grams: in [0, 4], never 0 against int8
    EXPECT_GT(e["plasticity"].get<double>(), 0.0);
    EXPECT_LE(e["plasticity"].get<double>(), 4.0);
  }
  auto sum = nlohmann::json::parse(slurp(a + "/summary.json"));
  for (const char* k : {"frozen_fraction_final", "backward_flops_saved_fraction", "reference_overhead_fraction",
                        "evaluations_dropped", "freeze_units"})
    EXPECT_TRUE(sum.contains(k)) << k;
  EXPECT_EQ(sum["freeze_units"].size(), 5u);  // 2 encoder, 2 decoder layers and the embedding
  EXPECT_EQ(sum["freeze_units"].back()["name"], "embedding");

  c.out = b;
  c.checkpoint_every = 1;
  c.stop_after_steps = 13;
  EXPECT_FALSE(train::run_translation(c, &arch).completed);
  c.resume = true;
  c.stop_after_steps = 0;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k;
  auto decisions = [](const std::string& path) {
    std::vector<std::string> d;
    for (const char* t : {"bootstrap", "freeze", "unfreeze"})
      for (auto& j : records(path, t)) d.push_back(std::string(t) + "@" + std::to_string(j["step"].get<int64_t>()));
    return d;
  };
  EXPECT_EQ(decisions(b + "/freeze.jsonl"), decisions(a + "/freeze.jsonl"));
}

TEST(Translate, BadInputIsNamed) {
  std::string d = tmpdir("bad");
  auto expect_error = [&](train::TrainConfig c, const std::string& needle) {
    try {
      train::run_training(c);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = toy_run(d + "/nowhere", d + "/out");
  expect_error(c, "nowhere/train.tsv': no such file. Run `tools/get-data datasets`");
  c.dataset = "cifar10";
  expect_error(c, "use --dataset en-es");
  c = toy_run(d, d + "/out");
  c.vocab_size = 3;
  expect_error(c, "--vocab-size");
  c = toy_run(d, d + "/out");
  c.target_accuracy = 0.9;
  expect_error(c, "--target-accuracy applies to image models");
  auto img = train::TrainConfig();
  img.dataset = "en-es";
  expect_error(img, "train it with --model transformer-tiny");
  img = train::TrainConfig();
  img.pad_to_multiple = 8;
  expect_error(img, "--pad-to-multiple applies to translation");
  std::ofstream(d + "/train.tsv") << "one\ttwo\nbroken line\n";
  expect_error(toy_run(d, d + "/out"), "train.tsv:2: expected 'source<TAB>target'");
}

// Note [Padding in a reading]: the same three sentences padded to two lengths give the
// same plasticity reading at every layer module, with an fp32 and with an int8 reference
// (per-token scales). The reference is another model of the architecture (as a snapshot
// of earlier weights is), so the readings are far from 0.
TEST(Translate, PaddingDoesNotChangeAPlasticityReading) {
  models::TransformerConfig tc;
  tc.vocab = 40, tc.d_model = 32, tc.heads = 4, tc.ffn = 64, tc.enc_layers = tc.dec_layers = 2, tc.max_len = 32;
  tc.dropout = 0;
  Generator g1(1), g2(2);
  models::Transformer train_model(tc, g1), fp32_ref(tc, g2), int8_ref(tc, g2);
  // 2 + 2 layers: the int8 copy's every Linear dynamically quantised.
  EXPECT_GT(quant::convert_to_int8(int8_ref), 0);
  const std::vector<std::vector<int64_t>> src = {{5, 6, 7, 8, 9, 2}, {10, 11, 2}, {12, 13, 14, 15, 2}},
                                          tgt = {{1, 16, 17, 18, 19}, {1, 20}, {1, 21, 22, 23}};
  auto padded = [](const std::vector<std::vector<int64_t>>& rows, int64_t len) {
    std::vector<int64_t> v;
    for (auto& r : rows) {
      v.insert(v.end(), r.begin(), r.end());
      v.insert(v.end(), size_t(len) - r.size(), 0);  // pad_id
    }
    return Tensor::from_vector(v, {int64_t(rows.size()), len});
  };
  const Tensor s6 = padded(src, 6), s14 = padded(src, 14), t5 = padded(tgt, 5), t11 = padded(tgt, 11);
  for (int64_t layer = 0; layer < 4; ++layer) {
    for (bool int8 : {false, true}) {
      models::Transformer& ref = int8 ? int8_ref : fp32_ref;
      auto reading = [&](const Tensor& s, const Tensor& t) {
        models::Capture c;
        c.layer = layer;
        autograd::NoGradGuard ng;
        train_model.forward_frozen(s, t, 0, &c);
        return freeze::sp_loss(c.output, ref.layer_output(s, t, layer));
      };
      const double short_pad = reading(s6, t5), long_pad = reading(s14, t11);
      EXPECT_GT(short_pad, 1e-4) << "layer " << layer << (int8 ? " int8" : " fp32");
      // Float rounding alone (the masked softmax and the Gram sum over more zeros): measured
      // <= 2.5e-6 relative. Without the zeroed padding the readings differ by ~90%; with
      // zeroed outputs but one int8 scale per tensor, by up to 0.7%.
      EXPECT_NEAR(short_pad, long_pad, 1e-5 * short_pad) << "layer " << layer << (int8 ? " int8" : " fp32");
    }
  }
}

// --eval-every N: the validation loss and perplexity every N steps (no BLEU), between the
// steps: the training is that of a run without it, step for step.
TEST(Translate, EvalEveryLogsTheValidationLossBetweenSteps) {
  std::string data = tmpdir("eval_data");
  write_toy_corpus(data);
  const auto arch = tiny_arch();
  auto c = toy_run(data, tmpdir("eval_plain"));
  c.epochs = 2;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);
  const std::string plain = c.out;
  c.out = tmpdir("eval_every");
  c.eval_every = 4;
  ASSERT_TRUE(train::run_translation(c, &arch).completed);
  const auto a = records(plain + "/metrics.jsonl", "step"), b = records(c.out + "/metrics.jsonl", "step");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i + 1;
  const auto evals = records(c.out + "/metrics.jsonl", "eval"), epochs = records(c.out + "/metrics.jsonl", "epoch");
  ASSERT_EQ(evals.size(), a.size() / 4);
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i]["step"], int64_t(4 * (i + 1)));
    EXPECT_FALSE(evals[i].contains("valid_bleu"));
    EXPECT_DOUBLE_EQ(evals[i]["valid_perplexity"].get<double>(), std::exp(evals[i]["valid_loss"].get<double>()));
  }
  EXPECT_LT(evals.back()["valid_loss"].get<double>(), evals.front()["valid_loss"].get<double>());
  // At an epoch's last step the loss-only evaluation equals the epoch's.
  for (auto& e : epochs)
    for (auto& v : evals)
      if (v["step"] == e["step"]) {
        EXPECT_DOUBLE_EQ(v["valid_loss"].get<double>(), e["valid_loss"].get<double>());
      }
}

// --pad-to-multiple 8: the batches' lengths padded up to 8 (a graph per shape under
// --cuda-graphs on) train as the unpadded batches (no dropout, whose draws follow the
// shape): the same losses but for rounding; config.json records the multiple, and one
// that would pad past the model's positions is refused naming both.
TEST(Translate, PaddingToAMultipleTrainsAsWithout) {
  std::string data = tmpdir("pad_data");
  write_toy_corpus(data);
  auto arch = tiny_arch();
  arch.dropout = 0;
  std::vector<nlohmann::json> steps[2];
  for (int padded = 0; padded < 2; ++padded) {
    auto c = toy_run(data, tmpdir(padded ? "pad_8" : "pad_1"));
    c.epochs = 2;
    c.pad_to_multiple = padded ? 8 : 1;
    ASSERT_TRUE(train::run_translation(c, &arch).completed);
    steps[padded] = records(c.out + "/metrics.jsonl", "step");
    EXPECT_EQ(nlohmann::json::parse(slurp(c.out + "/config.json"))["pad_to_multiple"], c.pad_to_multiple);
  }
  ASSERT_EQ(steps[0].size(), steps[1].size());
  ASSERT_GT(steps[0].size(), 20u);
  for (size_t i = 0; i < steps[0].size(); ++i) {
    const double a = steps[0][i]["loss"].get<double>(), b = steps[1][i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 1e-4 * a) << "step " << i + 1;
  }
  auto c = toy_run(data, tmpdir("pad_too_far"));
  c.max_len = 60;
  c.pad_to_multiple = 48;  // 60 tokens padded to 96, past tiny_arch's 64 positions
  try {
    train::run_translation(c, &arch);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pad-to-multiple 48 pads --max-len 60 sentences to 96 tokens"),
              std::string::npos)
        << e.what();
  }
}

// The tokenizer a run trains does not depend on the run's --threads (SentencePiece's
// unigram trainer sums per thread: with the run's threads, 1 and 2 gave two tokenizers).
TEST(Translate, TheTokenizerIsTheSameWhateverTheRunsThreads) {
  std::vector<std::string> models;
  for (int threads : {1, 2}) {
    std::string data = tmpdir("tok_threads_data_" + std::to_string(threads));
    write_toy_corpus(data);
    auto c = toy_run(data, tmpdir("tok_threads_" + std::to_string(threads)));
    c.threads = threads;
    c.epochs = 1;
    c.train_limit = 64;
    ASSERT_TRUE(train::run_training(c).completed);
    std::ifstream f(data::tokenizer_path(data, c.vocab_size), std::ios::binary);
    models.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(models[0].empty());
  EXPECT_TRUE(models[0] == models[1]) << "the tokenizer trained with --threads 1 differs from --threads 2's";
}

// The freezing policies' constant loss (SmartFRZ's wait): the entropy of the training
// targets' token frequencies, eos included, so under log(vocab) and above 0; label
// smoothing moves the frequencies towards uniform and raises it.
TEST(Translate, TheConstantLossIsOfTheTrainingTargetsTokens) {
  std::string data = tmpdir("constant_loss_data");
  write_toy_corpus(data);
  auto constant = [&](double smoothing) {
    auto c = toy_run(data, tmpdir("constant_loss"));
    c.label_smoothing = smoothing;
    auto local = dist::make_local();
    train::TranslationTask task(tiny_arch());
    task.setup(c, *local);
    freeze::PolicyConfig pc = train::policy_config(c);
    task.configure_freezing(pc);
    return std::make_pair(pc.constant_loss, pc.model.vocab);
  };
  const auto [plain, vocab] = constant(0);
  EXPECT_GT(plain, 1.0);
  EXPECT_LT(plain, std::log(double(vocab)));
  const double smoothed = constant(0.1).first;
  EXPECT_GT(smoothed, plain);
  EXPECT_LT(smoothed, std::log(double(vocab)));
}

// The task's side of --cuda-graphs on, run on the CPU: stage_graph_batch() writes a batch
// into the graph inputs (no move: made once for the largest batch) and returns its shape
// and target tokens; graph_forward() then gives training_step()'s loss on the same batch
// bit for bit (no dropout); and two batches of one padded shape run the same ops.
TEST(Translate, TheGraphedForwardOfABatchIsItsEagerForward) {
  std::string data = tmpdir("graph_fwd_data");
  write_toy_corpus(data);
  auto arch = tiny_arch();
  arch.dropout = 0;
  auto c = toy_run(data, tmpdir("graph_fwd"));
  c.pad_to_multiple = 8;
  auto local = dist::make_local();
  train::TranslationTask task(arch);
  task.setup(c, *local);
  dist::Strategy dp(*local, "cpu", {});
  freeze::PolicyConfig pc = train::policy_config(c);
  task.configure_freezing(pc);
  train::FreezeRun fr(c, task.model(), pc, c.out, dp);
  autograd::NoGradGuard ng;
  std::map<std::vector<int64_t>, std::vector<ops::OpRecord>> ops_of_shape;
  int same_shape = 0;
  for (int64_t k = 0; k < 8; ++k) {
    fr.start_step(k);
    task.start_epoch(0, k);
    ASSERT_TRUE(task.next_batch());
    const train::StepOutput eager = task.training_step(fr);
    task.start_epoch(0, k);
    ASSERT_TRUE(task.next_batch());
    const train::Task::GraphBatch b = task.stage_graph_batch();
    ASSERT_EQ(b.shape.size(), 3u);
    EXPECT_EQ(b.shape[1] % 8, 0);
    EXPECT_EQ(b.shape[2] % 8, 0);
    EXPECT_EQ(b.samples, eager.samples);
    EXPECT_EQ(b.moves, 0);
    ops::OpRecorder rec;
    const train::StepOutput graphed = task.graph_forward(fr);
    const std::vector<ops::OpRecord> ran = rec.records();
    EXPECT_EQ(graphed.samples, eager.samples);
    EXPECT_EQ(graphed.loss.item(), eager.loss.item()) << "batch " << k;
    auto [it, fresh] = ops_of_shape.emplace(b.shape, ran);
    if (!fresh) {
      ++same_shape;
      EXPECT_EQ(it->second, ran) << "batch " << k << ": another batch of its shape ran other ops";
    }
  }
  EXPECT_GT(same_shape, 0) << "8 batches of the toy corpus in few padded shapes";
}

// --cuda-graphs on for translation (Note [Graphed steps] in train/graphed_step.h): with
// --pad-to-multiple 8, a graph per batch shape; the run trains as without graphs (the same
// losses within the order of atomic adds), most steps replay a graph, and a steady-state
// step makes no host sync.
TEST(Cuda, ATranslationRunWithCudaGraphsTrainsAsWithout) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU present";
  std::string data = tmpdir("graphs_data");
  write_toy_corpus(data);
  const auto arch = tiny_arch();  // dropout 0.1: its masks drawn from counters moved past each replay
  std::vector<nlohmann::json> steps[2];
  nlohmann::json sj[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    auto c = toy_run(data, tmpdir(graphs ? "graphs_on" : "graphs_off"));
    c.device = "cuda:0";
    c.threads = 1;
    c.epochs = 4;
    c.pad_to_multiple = 8;
    c.cuda_graphs = graphs == 1;
    ASSERT_TRUE(train::run_translation(c, &arch).completed);
    steps[graphs] = records(c.out + "/metrics.jsonl", "step");
    sj[graphs] = nlohmann::json::parse(slurp(c.out + "/summary.json"));
  }
  ASSERT_EQ(steps[0].size(), steps[1].size());
  for (size_t i = 0; i < steps[0].size(); ++i) {
    const double a = steps[0][i]["loss"].get<double>(), b = steps[1][i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 1e-3 * a) << "step " << i + 1;
  }
  const int64_t total = int64_t(steps[0].size());
  EXPECT_GE(sj[1].at("cuda_graph_captures").get<int64_t>(), 1) << sj[1].dump();
  EXPECT_GE(sj[1].at("cuda_graph_replayed_steps").get<int64_t>(), total / 2) << sj[1].dump() << " of " << total;
  EXPECT_LE(sj[1].at("cuda_graphs_held").get<int64_t>(), 8);
  EXPECT_EQ(sj[1].at("host_syncs_per_step"), 0) << sj[1].dump();
}

// transformer-small: the base model's 6+6 layers at half the width; `egeria bench step`
// times its step with a frozen front, in target tokens.
TEST(Translate, SmallPresetAndItsStepBenchmark) {
  const models::TransformerConfig s = models::transformer_preset("transformer-small", 8000);
  EXPECT_EQ(s.enc_layers, 6);
  EXPECT_EQ(s.dec_layers, 6);
  EXPECT_EQ(s.d_model, 256);
  EXPECT_EQ(s.ffn, 1024);
  EXPECT_EQ(train::default_config("transformer-small").warmup_steps, 1000);
  auto local = dist::make_local();
  train::StepBenchOptions o;
  o.model = "transformer-small";
  o.batch_size = 2;
  o.seq_len = 8;
  o.iterations = 1;
  o.threads = 1;
  const train::StepBench whole = train::bench_step(o, *local);
  EXPECT_GT(whole.samples_per_second, 0);
  EXPECT_EQ(whole.frozen_parameters, 0);
  o.unit_per_layer = true;
  o.frozen_units = 6;  // the encoder
  const train::StepBench front = train::bench_step(o, *local);
  EXPECT_EQ(front.parameters, whole.parameters);
  EXPECT_GT(front.frozen_parameters, whole.parameters / 4);
  EXPECT_LT(front.frozen_parameters, whole.parameters / 2);
  o.frozen_units = 13;  // 12 layers and the embedding (the head): the head never freezes
  EXPECT_NE(eg::testing::error_of([&] { train::bench_step(o, *local); }).find("never freezes"), std::string::npos);
}
