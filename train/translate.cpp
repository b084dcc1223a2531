#include "train/translate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/parallel.h"
#include "data/text.h"
#include "models/transformer.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "quant/reference.h"
#include "train/freezing.h"
#include "train/safetensors.h"

namespace eg::train {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

bool is_translation_model(const std::string& m) { return m.rfind("transformer", 0) == 0; }

std::string translation_data_dir(const std::string& d) {
  const std::string dir = d.empty() ? "datasets/en-es" : d;
  auto has = [](const std::string& p) { return std::ifstream(p + "/train.tsv").good(); };
  return !has(dir) && has(dir + "/en-es") ? dir + "/en-es" : dir;
}

namespace {

const char* kCheckpoint = "checkpoint.safetensors";
constexpr double kLabelSmoothing = 0.1;  // training loss only; reported eval losses are plain NLL
constexpr int64_t kEvalBatch = 64;
// Greedy decoding stops at eos, or at 1.2 x the source length + 10 tokens. A trained model
// emits eos long before; the bound caps the cost of an untrained one, which is quadratic in
// the length because models::Transformer::greedy_decode recomputes the whole prefix per token.
int64_t decode_limit(int64_t src_len) { return src_len + src_len / 5 + 10; }

using detail::file_exists;

void append_line(const std::string& path, const json& j) { detail::append_json_line(path, j.dump()); }

json arch_json(const models::TransformerConfig& a) {
  return {{"vocab", a.vocab}, {"d_model", a.d_model}, {"heads", a.heads}, {"ffn", a.ffn},
          {"enc_layers", a.enc_layers}, {"dec_layers", a.dec_layers}, {"max_len", a.max_len},
          {"dropout", a.dropout}, {"pad_id", a.pad_id}, {"bos_id", a.bos_id}, {"eos_id", a.eos_id}};
}

models::TransformerConfig arch_from_json(const json& j) {
  models::TransformerConfig a;
  a.vocab = j.at("vocab"), a.d_model = j.at("d_model"), a.heads = j.at("heads"), a.ffn = j.at("ffn");
  a.enc_layers = j.at("enc_layers"), a.dec_layers = j.at("dec_layers"), a.max_len = j.at("max_len");
  a.dropout = j.at("dropout"), a.pad_id = j.at("pad_id"), a.bos_id = j.at("bos_id"), a.eos_id = j.at("eos_id");
  return a;
}

std::vector<data::SentencePair> read_split(const std::string& dir, const std::string& name, int64_t limit) {
  const std::string p = dir + "/" + name + ".tsv";
  EG_CHECK(file_exists(p), "cannot open '", p, "': no such file. Run `tools/get-data datasets` for the English-",
           "Spanish pairs (datasets/en-es), or pass --data-dir DIR holding train.tsv, valid.tsv and test.tsv");
  auto pairs = data::read_tsv_pairs(p);
  if (limit > 0 && limit < int64_t(pairs.size())) pairs.resize(size_t(limit));
  return pairs;
}

// A split's token ids (batches, loss) and the reference text of each kept pair (BLEU).
struct Split {
  std::shared_ptr<const data::TokenizedPairs> pairs;
  std::vector<std::string> refs;
};

Split make_split(const std::vector<data::SentencePair>& pairs, const data::Tokenizer& tok, int64_t max_len,
                 bool train) {
  // Training drops pairs longer than max_len; evaluation cuts them, so every sentence counts.
  auto t = std::make_shared<data::TokenizedPairs>(data::tokenize_pairs(pairs, tok, max_len, train));
  EG_CHECK(t->size() > 0, "every sentence pair is longer than --max-len ", max_len, " tokens");
  Split s;
  for (int64_t o : t->origin) s.refs.push_back(pairs[size_t(o)].tgt);
  s.pairs = std::move(t);
  return s;
}

data::Tokenizer open_tokenizer(const std::string& dir, const std::vector<data::SentencePair>& train, int64_t vocab,
                               int threads) {
  const std::string p = data::tokenizer_path(dir, vocab);
  if (!file_exists(p)) {
    std::printf("training a SentencePiece tokenizer (%lld pieces, both languages) on %zu pairs -> %s\n",
                (long long)vocab, train.size(), p.c_str());
    std::fflush(stdout);
  }
  return data::Tokenizer::load_or_train(train, p, vocab, threads);
}

// BLEU is computed on detokenised text (the tokenizer's decode), split into words at
// spaces after ASCII punctuation is split off as words of its own (roughly sacreBLEU's
// 13a tokenisation), case-sensitive. Unlike BLEU on SentencePiece pieces it does not
// depend on the vocabulary, so runs with different --vocab-size compare.
std::vector<std::string> bleu_words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) w.push_back(cur);
    cur.clear();
  };
  for (char ch : s) {
    if (ch == ' ' || ch == '\t' || ch == '\n') {
      flush();
    } else if (std::string(".,;:!?\"()[]{}").find(ch) != std::string::npos) {
      flush();
      w.emplace_back(1, ch);
    } else {
      cur += ch;
    }
  }
  flush();
  return w;
}

double text_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  std::unordered_map<std::string, int64_t> vocab;
  auto ids = [&](const std::string& s) {
    std::vector<int64_t> v;
    for (auto& w : bleu_words(s)) v.push_back(vocab.emplace(w, int64_t(vocab.size())).first->second);
    return v;
  };
  std::vector<std::vector<int64_t>> h, r;
  for (size_t i = 0; i < hyps.size(); ++i) {
    h.push_back(ids(hyps[i]));
    r.push_back(ids(refs[i]));
  }
  return models::corpus_bleu(h, r);
}

struct EvalOut {
  double loss = 0, bleu = 0;
};

// Teacher-forced NLL per target token, and BLEU of greedy translations.
EvalOut evaluate(models::Transformer& m, const Split& s, const data::Tokenizer& tok, Device dev) {
  autograd::NoGradGuard ng;
  m.eval();
  data::BatcherOptions o;
  o.batch_size = kEvalBatch;
  o.shuffle = false;  // sorted by length: little padding, and decoding ends together
  o.ids = tok.special_ids();
  data::TranslationBatcher batcher(s.pairs, o);
  batcher.start_epoch(0);
  std::vector<std::string> hyps(s.refs.size());
  double loss = 0;
  int64_t tokens = 0;
  data::TranslationBatch b;
  while (batcher.next(b)) {
    Tensor src = b.src.to(dev);
    Tensor logits = m.forward(src, b.tgt_in.to(dev));
    const int64_t n = b.tgt_out.numel();
    loss += fn::cross_entropy(logits.reshape({n, logits.size(2)}), b.tgt_out.reshape({n}).to(dev), 0.0, o.ids.pad)
                .item() *
            double(b.tgt_tokens);
    tokens += b.tgt_tokens;
    auto out = m.greedy_decode(src, decode_limit(src.size(1)));
    for (size_t r = 0; r < out.size(); ++r) hyps[size_t(b.ids[r])] = tok.decode(out[r]);
  }
  m.train();
  return {loss / double(std::max<int64_t>(tokens, 1)), text_bleu(hyps, s.refs)};
}

}  // namespace

Summary run_translation(const TrainConfig& c, const models::TransformerConfig* arch) {
  validate(c);
  const Device dev = Device::parse(c.device);
  if (dev.is_cuda())
    EG_CHECK(cuda_available(), "--device ", c.device, ": ",
             built_with_cuda() ? "no CUDA GPU is visible" : "this build has no CUDA support (rebuild with -DEG_CUDA=ON)");
  set_num_threads(c.threads);
  if (!c.cpu_winograd.empty()) set_cpu_winograd(c.cpu_winograd == "on");

  // ---- data and tokenizer
  const std::string dir = translation_data_dir(c.data_dir);
  auto train_pairs = read_split(dir, "train", 0);
  data::Tokenizer tok = open_tokenizer(dir, train_pairs, c.vocab_size, std::max(1, num_threads()));
  if (c.train_limit > 0 && c.train_limit < int64_t(train_pairs.size())) train_pairs.resize(size_t(c.train_limit));
  const Split train = make_split(train_pairs, tok, c.max_len, true);
  const Split valid = make_split(read_split(dir, "valid", c.test_limit), tok, c.max_len, false);
  const Split test = make_split(read_split(dir, "test", c.test_limit), tok, c.max_len, false);

  // ---- model, optimizer, schedule
  models::TransformerConfig mc = arch ? *arch : models::transformer_preset(c.model, tok.vocab_size());
  const data::SpecialIds sp = tok.special_ids();  // See Note [Special token ids]
  mc.vocab = tok.vocab_size();
  mc.pad_id = sp.pad, mc.bos_id = sp.bos, mc.eos_id = sp.eos;
  EG_CHECK(c.max_len <= mc.max_len, "--max-len ", c.max_len, " exceeds the ", mc.max_len,
           " positions of model ", c.model);
  // Dropout draws from the generator the model was built with (not the default one), so
  // that generator lives as long as the model and its state is in every checkpoint.
  Generator gen(c.seed);
  auto model = std::make_shared<models::Transformer>(mc, gen);
  model->to(dev);
  std::unique_ptr<optim::Optimizer> opt;
  if (c.optimizer == "sgd")
    opt = std::make_unique<optim::SGD>(model->parameters(), c.lr,
                                       optim::SgdOptions{c.momentum, 0.0, c.weight_decay, c.nesterov});
  else
    opt = std::make_unique<optim::AdamW>(model->parameters(), c.lr,
                                         optim::AdamWOptions{c.adam_beta1, c.adam_beta2, 1e-8, c.weight_decay});
  data::BatcherOptions bo;
  bo.batch_size = c.batch_size;
  bo.max_tokens = c.max_tokens;
  bo.seed = c.seed;
  bo.ids = sp;
  data::TranslationBatcher batcher(train.pairs, bo);
  const int64_t steps_per_epoch = int64_t(batcher.epoch_plan(0).size());
  auto sched = detail::make_schedule(c, steps_per_epoch);

  json cfg = json::parse(detail::config_json_text(c));
  cfg["data_dir"] = dir;
  cfg["vocab_size"] = c.vocab_size;
  cfg["max_len"] = c.max_len;
  cfg["max_tokens"] = c.max_tokens;
  cfg["tokenizer"] = tok.path();
  cfg["arch"] = arch_json(mc);
  std::printf("%s: %lld training pairs (%lld longer than --max-len %lld dropped), %lld valid, %lld test; "
              "vocabulary %lld (%s); %s: %lld parameters, %lld batches per epoch\n",
              c.dataset.c_str(), (long long)train.pairs->size(), (long long)train.pairs->dropped, (long long)c.max_len,
              (long long)valid.pairs->size(), (long long)test.pairs->size(), (long long)mc.vocab, tok.path().c_str(),
              c.model.c_str(), (long long)model->num_parameters(), (long long)steps_per_epoch);

  // ---- output directory, resumption
  detail::make_dirs(c.out);
  const std::string ckpt = c.out + "/" + kCheckpoint, metrics = c.out + "/metrics.jsonl";
  json state = {{"epoch", 0}, {"batch", 0}, {"step", 0}, {"train_seconds", 0.0}, {"tokens", 0},
                {"best_valid_bleu", 0.0}, {"epoch_loss_sum", 0.0}, {"epoch_loss_n", 0}};
  // Layer freezing (Note [Freezing a Transformer]); the reference model is built with
  // this run's architecture.
  freeze::PolicyConfig pc = policy_config(c);
  pc.model.vocab = mc.vocab;
  pc.make_model = [mc] {
    Generator g(0);
    return models::ModelPtr(std::make_shared<models::Transformer>(mc, g));
  };
  pc.total_steps = c.epochs * steps_per_epoch;
  pc.tracker.final_lr = sched->lr_at(std::max<int64_t>(pc.total_steps - 1, 0));
  pc.steps_per_epoch = steps_per_epoch;
  FreezeRun fr(c, *model, pc, c.out, !(c.resume && file_exists(ckpt)));
  if (c.resume && file_exists(ckpt)) {
    Metadata meta;
    TensorMap all = load_safetensors(ckpt, &meta);
    json saved = json::parse(meta.at("state")), scfg = json::parse(meta.at("config"));
    EG_CHECK(scfg.at("model") == c.model, "--resume: '", ckpt, "' is a checkpoint of model '",
             scfg.at("model").get<std::string>(), "', not '", c.model, "'");
    EG_CHECK(scfg.at("dataset") == c.dataset, "--resume: '", ckpt, "' was trained on '",
             scfg.at("dataset").get<std::string>(), "', not '", c.dataset, "'");
    EG_CHECK(scfg.value("arch", json()) == cfg["arch"], "--resume: '", ckpt, "' holds a model of architecture ",
             scfg.value("arch", json()).dump(), ", this run builds ", cfg["arch"].dump(),
             " (another --vocab-size or tokenizer?)");
    TensorMap ms, os;
    for (auto& [k, t] : all) {
      if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
      if (k.rfind("optim/", 0) == 0) os[k.substr(6)] = t;
    }
    model->load_state_dict(ms);
    opt->load_state_dict(os);
    fr.load(all, saved, ckpt);
    gen.set_state(saved.at("rng_seed"), saved.at("rng_offset"));
    state = saved;
    std::printf("resuming %s from epoch %lld, batch %lld (step %lld)\n", ckpt.c_str(),
                (long long)state["epoch"].get<int64_t>() + 1, (long long)state["batch"].get<int64_t>(),
                (long long)state["step"].get<int64_t>());
  } else {
    if (c.resume) std::printf("--resume: no checkpoint in '%s' yet; starting from the beginning\n", c.out.c_str());
    std::ofstream(metrics, std::ios::trunc);
  }
  write_file_atomic(c.out + "/config.json", cfg.dump(2) + "\n");

  auto save = [&](int64_t epoch, int64_t batch) {
    TensorMap all;
    for (auto& [k, t] : model->state_dict()) all["model/" + k] = t;
    for (auto& [k, t] : opt->state_dict()) all["optim/" + k] = t;
    fr.save(all, state);
    state["epoch"] = epoch;
    state["batch"] = batch;
    state["rng_seed"] = gen.seed();
    state["rng_offset"] = gen.offset();
    save_safetensors(ckpt, all, {{"state", state.dump()}, {"config", cfg.dump()}});
  };

  // ---- training
  const bool tty = ::isatty(STDOUT_FILENO);
  Summary s;
  int64_t step = state["step"], this_run = 0, tokens = state["tokens"];
  double train_secs = state["train_seconds"];
  model->train();
  const int64_t start_epoch = state["epoch"], start_batch = state["batch"];
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    batcher.start_epoch(epoch, epoch == start_epoch ? start_batch : 0);
    double loss_sum = epoch == start_epoch ? state["epoch_loss_sum"].get<double>() : 0.0;
    int64_t loss_n = epoch == start_epoch ? state["epoch_loss_n"].get<int64_t>() : 0;
    auto t_epoch = Clock::now();
    int64_t steps_here = 0;
    data::TranslationBatch b;
    while (batcher.next(b)) {
      auto t0 = Clock::now();
      const double lr = sched->lr_at(step);
      opt->set_lr(lr);
      Tensor captured;
      Tensor logits =
          model->forward_frozen(b.src.to(dev), b.tgt_in.to(dev), fr.frozen_layers(), fr.capture_layer(step), &captured);
      const int64_t n = b.tgt_out.numel();
      Tensor loss = fn::cross_entropy(fn::reshape(logits, {n, logits.size(2)}), b.tgt_out.reshape({n}).to(dev),
                                      kLabelSmoothing, sp.pad);
      const double lv = loss.item();
      if (!std::isfinite(lv)) {
        append_line(metrics, {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"loss", std::to_string(lv)}});
        EG_THROW("the training loss became ", lv, " at step ", step, " (epoch ", epoch + 1, ", batch ", b.index,
                 "); stopped without saving. The last good checkpoint is ",
                 file_exists(ckpt) ? "'" + ckpt + "'" : std::string("absent (none was written yet)"),
                 ". Try a lower --lr or a longer --warmup-steps.");
      }
      opt->zero_grad();
      loss.backward();
      opt->step();
      ++step, ++this_run, ++steps_here, ++loss_n;
      fr.after_step({step, epoch, lr, lv, b.tgt_in, Tensor()}, b.src, captured, train_secs);
      tokens += b.tgt_tokens;
      loss_sum += lv;
      train_secs += std::chrono::duration<double>(Clock::now() - t0).count();
      const double tps = double(tokens) / std::max(train_secs, 1e-9);  // target tokens, as fairseq's wps
      if (step % c.log_every == 0) {
        json j = {{"type", "step"}, {"step", step}, {"epoch", epoch + 1}, {"loss", lv}, {"lr", lr},
                  {"train_seconds", train_secs}, {"tokens_per_second", tps}};
        j.update(fr.step_fields());
        append_line(metrics, j);
      }
      const int64_t done = b.index + 1, total = steps_per_epoch;
      const double el = std::chrono::duration<double>(Clock::now() - t_epoch).count();
      detail::print_progress({epoch, c.epochs, done, total, step, loss_sum / double(loss_n), lv, lr, tps,
                              el / double(steps_here) * double(total - done), "tok/s"},
                             tty, c.log_every);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) {
        state["step"] = step;
        state["train_seconds"] = train_secs;
        state["tokens"] = tokens;
        state["epoch_loss_sum"] = loss_sum;
        state["epoch_loss_n"] = loss_n;
        save(epoch, b.index + 1);
      }
      if (c.stop_after_steps > 0 && this_run >= c.stop_after_steps) {
        s.steps = step;
        return s;  // as if killed here
      }
    }
    if (tty) std::printf("\n");
    EvalOut ev = evaluate(*model, valid, tok, dev);
    const double best = std::max(state["best_valid_bleu"].get<double>(), ev.bleu);
    state["best_valid_bleu"] = best;
    append_line(metrics, {{"type", "epoch"}, {"epoch", epoch + 1}, {"step", step},
                          {"train_loss", loss_n ? loss_sum / double(loss_n) : NAN}, {"valid_loss", ev.loss},
                          {"valid_bleu", ev.bleu}, {"lr", sched->lr_at(std::max<int64_t>(step - 1, 0))},
                          {"train_seconds", train_secs},
                          {"tokens_per_second", double(tokens) / std::max(train_secs, 1e-9)}});
    std::printf("epoch %lld/%lld: valid BLEU %.2f  valid loss %.4f  (best BLEU %.2f)  %s\n", (long long)epoch + 1,
                (long long)c.epochs, ev.bleu, ev.loss, best, detail::human_time(train_secs).c_str());
    std::fflush(stdout);
    state["step"] = step;
    state["train_seconds"] = train_secs;
    state["tokens"] = tokens;
    state["epoch_loss_sum"] = 0.0;
    state["epoch_loss_n"] = 0;
    save(epoch + 1, 0);
  }

  // ---- test and summary
  EvalOut te = evaluate(*model, test, tok, dev);
  append_line(metrics, {{"type", "test"}, {"step", step}, {"test_loss", te.loss}, {"test_bleu", te.bleu}});
  s.completed = true;
  s.steps = step;
  s.final_test_bleu = te.bleu;
  s.final_test_loss = te.loss;
  s.best_valid_bleu = state["best_valid_bleu"];
  s.train_seconds = train_secs;
  s.tokens_per_second = double(tokens) / std::max(train_secs, 1e-9);
  save_safetensors(c.out + "/model.safetensors", model->state_dict(), {{"model", c.model}, {"dataset", c.dataset}});
  json sj = {{"model", c.model}, {"dataset", c.dataset}, {"epochs", c.epochs}, {"final_test_bleu", s.final_test_bleu},
             {"final_test_loss", s.final_test_loss}, {"best_valid_bleu", s.best_valid_bleu},
             {"train_seconds", s.train_seconds}, {"tokens_per_second", s.tokens_per_second},
             {"time_to_target_seconds", nullptr}, {"steps", s.steps}, {"parameters", model->num_parameters()},
             {"flops_per_token", model->flops_per_sample()}, {"vocab_size", mc.vocab}, {"freeze", c.freeze}};
  fr.summarize(sj, s.steps, s.train_seconds);
  s.freeze_report = freeze_report(sj);
  write_file_atomic(c.out + "/summary.json", sj.dump(2) + "\n");
  std::printf("test BLEU %.2f  test loss %.4f\n", te.bleu, te.loss);
  return s;
}

EvalResult evaluate_translation_checkpoint(const std::string& out, const std::string& data_dir, int64_t test_limit,
                                           const std::string& precision) {
  Metadata meta;
  const std::string p = out + "/" + kCheckpoint;
  TensorMap all = load_safetensors(p, &meta);
  json cfg = json::parse(meta.at("config"));
  EG_CHECK(cfg.contains("arch") && cfg.contains("vocab_size"), "'", p,
           "' has no Transformer architecture in its metadata");
  const std::string dir = translation_data_dir(data_dir.empty() ? cfg.value("data_dir", "") : data_dir);
  data::Tokenizer tok = data::Tokenizer::load(data::tokenizer_path(dir, cfg.at("vocab_size")));
  const Split test = make_split(read_split(dir, "test", test_limit), tok, cfg.at("max_len"), false);
  models::TransformerConfig mc = arch_from_json(cfg.at("arch"));
  EG_CHECK(mc.vocab == tok.vocab_size(), "tokenizer '", tok.path(), "' has ", tok.vocab_size(), " pieces, but '", p,
           "' was trained with ", mc.vocab, " (was the tokenizer retrained?)");
  Generator g(0);
  auto m = std::make_shared<models::Transformer>(mc, g);
  TensorMap ms;
  for (auto& [k, t] : all)
    if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
  m->load_state_dict(ms);
  if (precision == "int8") quant::convert_to_int8(*m);  // every Linear dynamically quantised
  EvalOut e = evaluate(*m, test, tok, Device::cpu());
  EvalResult r;
  r.loss = e.loss;
  r.bleu = e.bleu;
  r.translation = true;
  r.samples = test.pairs->size();
  return r;
}

}  // namespace eg::train
