// data/text: the TSV reader names file:line of every problem; the tokenizer trains,
// round-trips and is reused; the batcher's order is a pure function of (seed, epoch).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <set>

#include "core/rng.h"
#include "data/text.h"
#include "tests/test_util.h"

using namespace eg;

namespace {
std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_text_" + name); }

void write(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string error_of(const std::string& p) {
  try {
    data::read_tsv_pairs(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A toy English-Spanish corpus: word-for-word sentences from a small lexicon.
std::vector<data::SentencePair> toy_pairs(int n, uint64_t seed) {
  const char* en[] = {"the", "cat", "dog", "sees", "eats", "big", "small", "red", "house", "water", "bread", "man"};
  const char* es[] = {"el",      "gato", "perro", "ve",   "come", "grande",
                      "pequeño", "rojo", "casa",  "agua", "pan",  "hombre"};
  std::vector<data::SentencePair> v;
  Generator g(seed);
  for (int i = 0; i < n; ++i) {
    const int len = 2 + int(g.next_u32() % 8);
    data::SentencePair p;
    for (int k = 0; k < len; ++k) {
      const uint32_t w = g.next_u32() % 12;
      p.src += (k ? " " : "") + std::string(en[w]);
      p.tgt += (k ? " " : "") + std::string(es[w]);
    }
    v.push_back(p);
  }
  return v;
}
// Every batch of a plan holds B * (its longest side + 1, padded to `multiple`) <= `budget`
// tokens.
void expect_within_budget(const data::TokenizedPairs& tp, const std::vector<std::vector<int64_t>>& plan, int64_t budget,
                          int64_t multiple) {
  for (auto& batch : plan) {
    size_t longest = 0;
    for (int64_t i : batch) longest = std::max({longest, tp.src[size_t(i)].size(), tp.tgt[size_t(i)].size()});
    EXPECT_LE(int64_t(batch.size()) * data::padded_length(int64_t(longest) + 1, multiple), budget);
  }
}
}  // namespace

TEST(TextTsv, ReadsPairsAndNamesFileAndLine) {
  std::string d = tmpdir("tsv");
  write(d + "/ok.tsv", "Hello .\tHola .\r\nthe cat\tel gato\n\xff\xfe bytes\tpass through\n");
  auto p = data::read_tsv_pairs(d + "/ok.tsv");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].src, "Hello .");
  EXPECT_EQ(p[0].tgt, "Hola .");  // the '\r' of a CRLF line is dropped
  EXPECT_EQ(p[2].src, "\xff\xfe bytes");

  EXPECT_NE(error_of(d + "/missing.tsv").find("missing.tsv': no such file"), std::string::npos);
  write(d + "/empty.tsv", "");
  EXPECT_NE(error_of(d + "/empty.tsv").find("empty.tsv' is empty"), std::string::npos) << error_of(d + "/empty.tsv");
  write(d + "/notab.tsv", "a\tb\nc\td\nno tab here\n");
  EXPECT_NE(error_of(d + "/notab.tsv").find("notab.tsv:3: expected 'source<TAB>target', found no tab"),
            std::string::npos)
      << error_of(d + "/notab.tsv");
  write(d + "/twotabs.tsv", "a\tb\tc\n");
  EXPECT_NE(error_of(d + "/twotabs.tsv").find("twotabs.tsv:1: expected 'source<TAB>target', found more than one tab"),
            std::string::npos);
  write(d + "/emptyside.tsv", "a\tb\n  \tx\n");
  EXPECT_NE(error_of(d + "/emptyside.tsv").find("emptyside.tsv:2: the source (before the tab) is empty"),
            std::string::npos);
  write(d + "/emptytgt.tsv", "a\t\n");
  EXPECT_NE(error_of(d + "/emptytgt.tsv").find("emptytgt.tsv:1: the target (after the tab) is empty"),
            std::string::npos);
}

TEST(TextTokenizer, TrainsRoundTripsAndIsReused) {
  std::string d = tmpdir("tok");
  auto pairs = toy_pairs(300, 1);
  const std::string path = data::tokenizer_path(d, 60);
  EXPECT_EQ(path, d + "/spm-60.model");
  auto tok = data::Tokenizer::load_or_train(pairs, path, 60);
  EXPECT_LE(tok.vocab_size(), 60);
  EXPECT_GT(tok.vocab_size(), 20);
  const data::SpecialIds sp = tok.special_ids();
  EXPECT_EQ(sp.pad, 0);
  EXPECT_EQ(tok.pieces({sp.bos, sp.eos}), (std::vector<std::string>{"<s>", "</s>"}));
  for (const std::string s : {"the big cat sees the water", "el perro pequeño come pan", "el hombre ve la casa roja"}) {
    auto ids = tok.encode(s);
    ASSERT_FALSE(ids.empty());
    for (int64_t i : ids) EXPECT_TRUE(i > sp.eos && i < tok.vocab_size()) << i;
    EXPECT_EQ(tok.decode(ids), s);
  }
  auto with_specials = tok.encode("the cat");
  with_specials.insert(with_specials.begin(), sp.bos);
  with_specials.push_back(sp.eos);
  with_specials.push_back(sp.pad);
  EXPECT_EQ(tok.decode(with_specials), "the cat");
  EXPECT_THROW(tok.decode({tok.vocab_size()}), Error);

  // No temporary file is left; a second load_or_train reuses the file even when given
  // other sentences (it does not retrain), and encodes identically.
  EXPECT_NE(std::system(("ls '" + d + "' | grep -q tmp").c_str()), 0);
  struct stat before {};
  ::stat(path.c_str(), &before);
  auto again = data::Tokenizer::load_or_train(toy_pairs(50, 99), path, 60);
  struct stat after {};
  ::stat(path.c_str(), &after);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_size, after.st_size);
  EXPECT_EQ(again.vocab_size(), tok.vocab_size());
  EXPECT_EQ(again.encode("the small red dog"), tok.encode("the small red dog"));

  write(d + "/bad.model", "not a model");
  try {
    data::Tokenizer::load(d + "/bad.model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.model' is not a SentencePiece model"), std::string::npos) << e.what();
  }
}

TEST(TextBatcher, BatchesArePaddedAndOrderIsAPureFunctionOfSeedAndEpoch) {
  std::string d = tmpdir("batch");
  auto pairs = toy_pairs(500, 2);
  pairs.push_back({"the cat the cat the cat the cat the cat the cat the cat the cat", "x"});  // too long
  auto tok = data::Tokenizer::train(pairs, d + "/spm.model", 60);
  auto tp = std::make_shared<data::TokenizedPairs>(data::tokenize_pairs(pairs, tok, 16, true));
  EXPECT_EQ(tp->dropped, 1);
  EXPECT_EQ(tp->size(), 500);
  auto cut = data::tokenize_pairs(pairs, tok, 16, false);
  EXPECT_EQ(cut.truncated, 1);
  EXPECT_EQ(cut.src.back().size(), 15u);

  data::BatcherOptions o;
  o.batch_size = 16;
  o.pool_batches = 4;
  o.seed = 7;
  data::TranslationBatcher b(tp, o);
  auto e0 = b.epoch_plan(0), e0again = b.epoch_plan(0), e1 = b.epoch_plan(1);
  EXPECT_EQ(e0, e0again);
  EXPECT_NE(e0, e1);
  data::TranslationBatcher other(tp, o);
  EXPECT_EQ(other.epoch_plan(1), e1);  // another instance, same (seed, epoch)
  o.seed = 8;
  EXPECT_NE(data::TranslationBatcher(tp, o).epoch_plan(0), e0);

  // Every pair exactly once per epoch; sorting within pools keeps padding low.
  std::multiset<int64_t> seen;
  int64_t padded = 0, real = 0;
  for (auto& batch : e0) {
    seen.insert(batch.begin(), batch.end());
    size_t longest = 0;
    for (int64_t i : batch) longest = std::max(longest, tp->tgt[size_t(i)].size());
    for (int64_t i : batch) real += int64_t(tp->tgt[size_t(i)].size());
    padded += int64_t(batch.size() * longest);
  }
  EXPECT_EQ(seen.size(), 500u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 500u);
  EXPECT_LT(double(padded - real) / double(padded), 0.25);

  // The tensors: src = x + eos, tgt_in = bos + y, tgt_out = y + eos, padded with pad.
  data::TranslationBatch tb;
  b.start_epoch(0);
  ASSERT_TRUE(b.next(tb));
  const int64_t B = int64_t(e0[0].size()), T = tb.tgt_in.size(1);
  EXPECT_EQ(tb.src.size(0), B);
  EXPECT_EQ(tb.tgt_out.shape(), tb.tgt_in.shape());
  auto ti = tb.tgt_in.to_vector<int64_t>(), to = tb.tgt_out.to_vector<int64_t>(), sv = tb.src.to_vector<int64_t>();
  int64_t tgt_tokens = 0;
  for (int64_t r = 0; r < B; ++r) {
    const auto& y = tp->tgt[size_t(tb.ids[size_t(r)])];
    const auto& x = tp->src[size_t(tb.ids[size_t(r)])];
    EXPECT_EQ(ti[size_t(r * T)], 1);
    for (size_t k = 0; k < y.size(); ++k) {
      EXPECT_EQ(ti[size_t(r * T) + k + 1], y[k]);
      EXPECT_EQ(to[size_t(r * T) + k], y[k]);
    }
    EXPECT_EQ(to[size_t(r * T) + y.size()], 2);
    for (size_t k = y.size() + 1; k < size_t(T); ++k) EXPECT_EQ(to[size_t(r * T) + k], 0);
    EXPECT_EQ(sv[size_t(r * tb.src.size(1)) + x.size()], 2);
    tgt_tokens += int64_t(y.size()) + 1;
  }
  EXPECT_EQ(tb.tgt_tokens, tgt_tokens);

  // Resuming at batch k yields the remaining batches of the uninterrupted epoch.
  const int64_t k = 5;
  b.start_epoch(1, k);
  for (size_t i = size_t(k); i < e1.size(); ++i) {
    ASSERT_TRUE(b.next(tb));
    EXPECT_EQ(tb.ids, e1[i]);
    EXPECT_EQ(tb.index, int64_t(i));
  }
  EXPECT_FALSE(b.next(tb));
  EXPECT_THROW(b.start_epoch(1, int64_t(e1.size()) + 1), Error);

  // A token budget bounds B * (longest side + 1).
  o.max_tokens = 96;
  expect_within_budget(*tp, data::TranslationBatcher(tp, o).epoch_plan(3), 96, 1);
}

// Data-parallel shares: with --batch-size B on each of 3 ranks, the epoch is planned in
// global batches of 3B, as one process with 3B plans it, and rank r gets the pairs r,
// r + 3, ... of each; a share of a short last batch may be empty, and is then a batch
// without ids or tensors.
TEST(TextBatcher, RanksTakeInterleavedSharesOfTheOneProcessPlan) {
  std::string d = tmpdir("shards");
  auto pairs = toy_pairs(101, 3);
  auto tok = data::Tokenizer::train(pairs, d + "/spm.model", 60);
  auto tp = std::make_shared<data::TokenizedPairs>(data::tokenize_pairs(pairs, tok, 16, true));
  data::BatcherOptions one;
  one.batch_size = 30;
  one.seed = 9;
  const auto plan = data::TranslationBatcher(tp, one).epoch_plan(2);
  ASSERT_EQ(plan.size(), 4u);  // 101 pairs: 30, 30, 30 and 11
  bool some_empty = false;
  for (int r = 0; r < 3; ++r) {
    data::BatcherOptions o = one;
    o.batch_size = 10;
    o.shard_rank = r, o.shards = 3;
    data::TranslationBatcher b(tp, o);
    EXPECT_EQ(b.epoch_plan(2), plan);
    b.start_epoch(2);
    data::TranslationBatch tb;
    for (size_t k = 0; k < plan.size(); ++k) {
      ASSERT_TRUE(b.next(tb));
      std::vector<int64_t> expect;
      for (size_t i = size_t(r); i < plan[k].size(); i += 3) expect.push_back(plan[k][i]);
      EXPECT_EQ(tb.ids, expect) << "rank " << r << " batch " << k;
      EXPECT_EQ(tb.index, int64_t(k));
      if (expect.empty()) {
        some_empty = true;
        EXPECT_FALSE(tb.src.defined());
        EXPECT_EQ(tb.tgt_tokens, 0);
      } else {
        EXPECT_EQ(tb.src.size(0), int64_t(expect.size()));
      }
    }
    EXPECT_FALSE(b.next(tb));
  }
  // The short batch's 11 pairs share out as 4, 4, 3: only a batch shorter than the ranks
  // leaves one empty.
  EXPECT_FALSE(some_empty);
  data::BatcherOptions tiny = one;
  tiny.batch_size = 1;
  tiny.shards = 3, tiny.shard_rank = 2;
  auto t2 = std::make_shared<data::TokenizedPairs>(*tp);
  t2->src.resize(4), t2->tgt.resize(4), t2->origin.resize(4);  // 4 pairs: batches of 3 and 1
  data::TranslationBatcher last(t2, tiny);
  last.start_epoch(0);
  data::TranslationBatch tb;
  int empty = 0;
  while (last.next(tb)) empty += tb.ids.empty();
  EXPECT_EQ(empty, 1) << "rank 2's share of the 1-pair batch";
}

// pad_to_multiple (--pad-to-multiple): the same batches, each side's length rounded up to
// a multiple, the extra positions pad; the unpadded prefix and the token counts unchanged,
// so an epoch takes a few shapes. A token budget counts the padded lengths. A multiple
// below 1 is refused.
TEST(TextBatcher, PaddingToAMultipleKeepsTheBatchesAndFewShapes) {
  std::string d = tmpdir("pad_multiple");
  auto pairs = toy_pairs(400, 4);
  auto tok = data::Tokenizer::train(pairs, d + "/spm.model", 60);
  auto tp = std::make_shared<data::TokenizedPairs>(data::tokenize_pairs(pairs, tok, 16, true));
  data::BatcherOptions o;
  o.batch_size = 8;
  o.seed = 3;
  data::BatcherOptions p = o;
  p.pad_to_multiple = 8;
  data::TranslationBatcher plain(tp, o), padded(tp, p);
  ASSERT_EQ(plain.epoch_plan(0), padded.epoch_plan(0));
  plain.start_epoch(0), padded.start_epoch(0);
  data::TranslationBatch a, b;
  std::set<std::vector<int64_t>> shapes, padded_shapes;
  while (plain.next(a)) {
    ASSERT_TRUE(padded.next(b));
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.src_tokens, b.src_tokens);
    EXPECT_EQ(a.tgt_tokens, b.tgt_tokens);
    shapes.insert({a.src.size(0), a.src.size(1), a.tgt_in.size(1)});
    padded_shapes.insert({b.src.size(0), b.src.size(1), b.tgt_in.size(1)});
    for (auto [x, y] : {std::pair{&a.src, &b.src}, {&a.tgt_in, &b.tgt_in}, {&a.tgt_out, &b.tgt_out}}) {
      const int64_t rows = x->size(0), n = x->size(1), m = y->size(1);
      ASSERT_EQ(y->size(0), rows);
      EXPECT_EQ(m % 8, 0);
      EXPECT_GE(m, n);
      EXPECT_LT(m - n, 8);
      const auto xv = x->to_vector<int64_t>(), yv = y->to_vector<int64_t>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < m; ++k)
          EXPECT_EQ(yv[size_t(r * m + k)], k < n ? xv[size_t(r * n + k)] : int64_t(0)) << r << "," << k;
    }
  }
  EXPECT_FALSE(padded.next(b));
  EXPECT_LT(padded_shapes.size(), shapes.size());
  EXPECT_LE(padded_shapes.size(), 2u * 2u * 2u) << "lengths up to 16 in two multiples of 8; batches of 8 and the last";
  // A token budget counts the padded lengths: B * (longest side + 1, padded) <= max_tokens.
  p.max_tokens = 96;
  expect_within_budget(*tp, data::TranslationBatcher(tp, p).epoch_plan(1), 96, 8);
  p.pad_to_multiple = 0;
  EXPECT_THROW(data::TranslationBatcher(tp, p), Error);
}
