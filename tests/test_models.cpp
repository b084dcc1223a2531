// models/: parameter counts match the published architectures; layer modules cover
// every parameter exactly once, front to back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/device.h"
#include "models/model.h"
#include "models/transformer.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

using namespace eg;

namespace {
models::ModelPtr build(const std::string& name, int64_t classes, int64_t image = 32, bool small = true) {
  Generator g(0);
  models::ModelConfig c;
  c.name = name;
  c.num_classes = classes;
  c.image_size = image;
  c.small_input = small;
  return models::build_model(c, g);
}
}  // namespace

TEST(Models, CifarResNetParameterCountsMatchHeEtAl) {
  // He et al. 2016, Table 6 (CIFAR-10): 0.27M, 0.46M, 0.66M, 0.85M, 1.7M.
  const std::pair<const char*, double> expected[] = {
      {"resnet20", 0.27e6}, {"resnet32", 0.46e6}, {"resnet44", 0.66e6}, {"resnet56", 0.85e6}, {"resnet110", 1.7e6}};
  for (auto [name, n] : expected) {
    auto m = build(name, 10);
    // The paper rounds to two significant figures (1,727,962 -> 1.7M).
    double p = double(m->num_parameters()), mag = std::pow(10.0, std::floor(std::log10(p)) - 1);
    EXPECT_EQ(std::round(p / mag) * mag, n) << name << ": " << m->num_parameters();
  }
}

TEST(Models, ImageNetParameterCountsMatchTorchvision) {
  EXPECT_EQ(build("resnet50", 1000, 224, false)->num_parameters(), 25557032);
  EXPECT_EQ(build("resnet18", 1000, 224, false)->num_parameters(), 11689512);
  EXPECT_EQ(build("mobilenetv2", 1000, 224, false)->num_parameters(), 3504872);
}

TEST(Models, FlopsPerSampleAreTheKnownValues) {
  // ResNet-56 on 32x32: ~125M multiply-adds (0.25 GFLOPs); ResNet-50 on 224: ~4.1G MACs.
  EXPECT_NEAR(build("resnet56", 10)->flops_per_sample(), 2 * 125.5e6, 0.03 * 2 * 125.5e6);
  EXPECT_NEAR(build("resnet50", 1000, 224, false)->flops_per_sample(), 2 * 4.09e9, 0.03 * 2 * 4.09e9);
}

TEST(Models, LayerModulesPartitionTheParameters) {
  for (const std::string name : {"resnet20", "resnet18", "mobilenetv2"}) {
    auto m = build(name, 10);
    auto units = m->layer_modules();
    ASSERT_GE(units.size(), 3u) << name;
    EXPECT_EQ(units.front().first, "stem");
    EXPECT_EQ(units.back().first, "head");
    int64_t total = 0;
    std::set<TensorImpl*> seen;
    for (auto& [n, u] : units)
      for (auto& p : u->parameters()) {
        EXPECT_TRUE(seen.insert(p.impl_ptr().get()).second) << name << ": parameter in two units";
        total += p.numel();
      }
    EXPECT_EQ(total, m->num_parameters()) << name;
  }
  EXPECT_EQ(build("resnet56", 10)->layer_modules().size(), 1u + 27u + 1u);
}

TEST(Models, UnknownModelListsTheKnownOnes) {
  try {
    build("resnet57", 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'resnet57'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet56"), std::string::npos);
  }
}

TEST(Models, TransformerBaseHasThePaperShape) {
  Generator g(0);
  models::ModelConfig c;
  c.name = "transformer-base";
  c.vocab = 37000;
  auto m = models::build_model(c, g);
  // Vaswani et al. Table 3 quotes ~65M with a 37k shared vocabulary. Counted exactly:
  // embedding 37000*512 + 6 encoder layers (4 projections 512*512+512, FFN
  // 512*2048+2048 + 2048*512+512, 2 LayerNorms) + 6 decoder layers (8 projections,
  // FFN, 3 LayerNorms) = 18,944,000 + 6*3,152,384 + 6*4,204,032.
  EXPECT_EQ(m->num_parameters(), 18944000 + 6 * 3152384 + 6 * 4204032);
  EXPECT_EQ(m->layer_modules().size(), 1u + 6u + 6u);
}

// Note [Freezing a Transformer]: encoders, then decoders, then the embedding (head).
TEST(Models, TransformerFreezesFrontToBackWithoutBackwardThroughTheFrozenPart) {
  models::TransformerConfig tc;
  tc.vocab = 50;
  tc.d_model = 16;
  tc.heads = 2;
  tc.ffn = 32;
  tc.enc_layers = tc.dec_layers = 2;
  tc.dropout = 0.0;
  Generator g(4);
  models::Transformer m(tc, g);
  auto layers = m.layer_modules();
  ASSERT_EQ(layers.size(), 5u);
  EXPECT_EQ(layers[0].first, "encoder.0");
  EXPECT_EQ(layers[2].first, "decoder.0");
  EXPECT_EQ(layers[4].first, "embedding");
  std::vector<int64_t> sv = {5, 6, 7, 8, 0, 9, 10, 11, 3, 4, 5, 0};  // 0: padding
  Tensor src = Tensor::from_vector(sv, {2, 6}),
         tgt = Tensor::from_vector(std::vector<int64_t>{1, 5, 6, 7, 1, 8, 9, 0}, {2, 4});
  Tensor full = m.forward(src, tgt);
  // Nothing frozen: the same logits; every layer's capture equals layer_output.
  for (int64_t l = 0; l < 4; ++l) {
    models::Capture c;
    c.layer = l;
    Tensor y = m.forward_frozen(src, tgt, 0, &c);
    const Tensor cap = c.output;
    EXPECT_EQ(y.to_vector<float>(), full.to_vector<float>());
    EXPECT_EQ(cap.to_vector<float>(), m.layer_output(src, tgt, l).to_vector<float>()) << layers[size_t(l)].first;
  }
  // The head's output is the logits, with the padding position (tgt's last) zeroed as
  // every output Egeria compares (Note [Padding in a reading]).
  std::vector<float> want = full.to_vector<float>();
  std::fill(want.end() - 50, want.end(), 0.f);
  EXPECT_EQ(m.layer_output(src, tgt, 4).to_vector<float>(), want);
  // The encoder frozen: same values, a smaller graph, no gradient for the encoder, and
  // the embedding still trains (target side and output projection).
  auto loss_of = [&](const Tensor& logits) {
    return fn::cross_entropy(fn::reshape(logits, {8, 50}),
                             Tensor::from_vector(std::vector<int64_t>{5, 6, 7, 2, 8, 9, 2, 0}, {8}));
  };
  const size_t nodes_full = autograd::graph_size(loss_of(full));
  for (int64_t k = 1; k <= 2; ++k) {
    Tensor y = m.forward_frozen(src, tgt, k);
    EXPECT_EQ(y.to_vector<float>(), full.to_vector<float>()) << k;
  }
  for (auto& p : m.parameters()) p.set_grad(Tensor());
  for (int64_t i = 0; i < 2; ++i) layers[size_t(i)].second->freeze();
  Tensor loss = loss_of(m.forward_frozen(src, tgt, 2));
  EXPECT_LT(autograd::graph_size(loss), nodes_full * 2 / 3);
  loss.backward();
  for (auto& p : layers[0].second->parameters()) EXPECT_FALSE(p.grad().defined());
  for (auto& p : layers[2].second->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_TRUE(layers[4].second->parameters()[0].grad().defined());
  EXPECT_THROW(m.forward_frozen(src, tgt, 5), Error);  // the head never freezes
}

namespace {
// Note [Incremental decoding]: greedy_decode runs one position at a time with each
// decoder layer's keys and values cached. Its tokens must be those of the full
// recomputation (Transformer::decode over the whole prefix): at every position the
// recomputed logits' argmax is the token it chose, or within `tie` of it (a near tie the
// two round differently), and a row that stopped early stopped at eos or pad. The model
// is first trained to copy its source (a random one repeats its input token forever,
// which a wrong cache would not change). Under bf16 autocast the two paths round their
// matrix products differently, hence the looser tie. Trained on the CPU, checked on `dev`.
void expect_incremental_decoding_picks_the_recomputed_tokens(Device dev) {
  models::TransformerConfig tc;
  tc.vocab = 24;
  tc.d_model = 32;
  tc.heads = 4;
  tc.ffn = 64;
  tc.enc_layers = tc.dec_layers = 2;
  tc.dropout = 0.0;
  Generator g(7);
  models::Transformer m(tc, g);
  // Sources of 3..8 tokens from 3..23, padded to 8; targets: the source, then eos.
  std::mt19937 rng(3);
  auto copy_batch = [&](int64_t b, std::vector<int64_t>& src, std::vector<int64_t>& tin, std::vector<int64_t>& tout) {
    src.assign(size_t(b * 8), tc.pad_id), tin.assign(size_t(b * 9), tc.pad_id), tout.assign(size_t(b * 9), tc.pad_id);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = 3 + int64_t(rng() % 6);
      tin[size_t(i * 9)] = tc.bos_id;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t w = 3 + int64_t(rng() % uint32_t(tc.vocab - 3));
        src[size_t(i * 8 + k)] = tin[size_t(i * 9 + k + 1)] = tout[size_t(i * 9 + k)] = w;
      }
      tout[size_t(i * 9 + n)] = tc.eos_id;
    }
  };
  {
    optim::AdamW opt(m.parameters(), 3e-3);
    std::vector<int64_t> s, ti, to;
    for (int step = 0; step < 150; ++step) {
      copy_batch(32, s, ti, to);
      Tensor logits = m.forward(Tensor::from_vector(s, {32, 8}), Tensor::from_vector(ti, {32, 9}));
      Tensor loss =
          fn::cross_entropy(fn::reshape(logits, {32 * 9, tc.vocab}), Tensor::from_vector(to, {32 * 9}), 0.0, tc.pad_id);
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
  }
  m.eval();
  std::vector<int64_t> sv, unused_in, unused_out;
  copy_batch(6, sv, unused_in, unused_out);
  const int64_t max_len = 12;
  if (!dev.is_cpu()) m.to(dev);
  const Tensor src = Tensor::from_vector(sv, {6, 8}, dev);
  for (DType precision : {DType::f32, DType::bf16}) {
    autograd::Autocast ac(precision);
    const std::string where = dev.str() + " " + dtype_name(precision);
    const double tie = precision == DType::f32 ? 1e-4 : 0.1;
    const auto out = m.greedy_decode(src, max_len);
    ASSERT_EQ(out.size(), 6u);
    int64_t stopped_early = 0, distinct = 0;
    for (int64_t i = 0; i < 6; ++i) {
      const auto& toks = out[size_t(i)];
      ASSERT_LE(int64_t(toks.size()), max_len);
      distinct += int64_t(std::set<int64_t>(toks.begin(), toks.end()).size());
      std::vector<int64_t> prefix = {tc.bos_id};
      prefix.insert(prefix.end(), toks.begin(), toks.end());
      const int64_t len = int64_t(prefix.size());
      Tensor row_mask;
      autograd::NoGradGuard ng;
      const Tensor memory = m.encode(src.slice(i, i + 1), row_mask);
      const std::vector<float> l =
          m.decode(memory, row_mask, Tensor::from_vector(prefix, {1, len}, dev)).to(DType::f32).to_vector<float>();
      for (int64_t p = 0; p < len; ++p) {
        const float* row = l.data() + p * tc.vocab;
        const int64_t best = std::max_element(row, row + tc.vocab) - row;
        if (p + 1 < len) {
          const int64_t chosen = toks[size_t(p)];
          EXPECT_TRUE(chosen == best || row[best] - row[chosen] <= tie)
              << where << " row " << i << " position " << p << ": chose " << chosen << " (logit " << row[chosen]
              << "), the recomputation's best is " << best << " (" << row[best] << ")";
        } else if (len - 1 < max_len) {  // stopped before the limit: at eos or pad
          ++stopped_early;
          EXPECT_TRUE(best == tc.eos_id || best == tc.pad_id ||
                      row[best] - std::max(row[tc.eos_id], row[tc.pad_id]) <= tie)
              << where << " row " << i << " stopped after " << len - 1
              << " tokens, where the recomputation continues with " << best;
        }
      }
    }
    EXPECT_GE(stopped_early, 3) << where << ": too few rows ended at eos to test it";
    EXPECT_GE(distinct, 12) << where << ": the decoded rows hardly vary";
  }
}
}  // namespace

TEST(Models, TransformerIncrementalDecodingPicksTheTokensOfTheFullRecomputation) {
  expect_incremental_decoding_picks_the_recomputed_tokens(Device::cpu());
}

// The same on a GPU (its name matches gpu-experiments' CUDA filter).
TEST(Models, TransformerIncrementalDecodingOnCudaPicksTheTokensOfTheFullRecomputation) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU present";
  expect_incremental_decoding_picks_the_recomputed_tokens(Device::cuda(0));
}

TEST(Models, CorpusBleu) {
  std::vector<std::vector<int64_t>> ref = {{1, 2, 3, 4, 5, 6}};
  EXPECT_NEAR(models::corpus_bleu(ref, ref), 100.0, 1e-9);
  EXPECT_EQ(models::corpus_bleu({{7, 8, 9}}, ref), 0.0);
  double partial = models::corpus_bleu({{1, 2, 3, 4, 9, 6}}, ref);
  EXPECT_GT(partial, 0.0);
  EXPECT_LT(partial, 100.0);
}

namespace {
// Nine SGD steps on one fixed batch: the training loss must fall by 15%. A model whose
// forward, backward or parameter registration is broken does not fit a batch.
void expect_fits(const std::string& name, const std::function<Tensor()>& loss_fn, nn::Module& m, double lr) {
  m.train();
  optim::SGD opt(m.parameters(), lr, {0.9, 0, 0, false});
  double first = 0, last = 0;
  for (int s = 0; s < 10; ++s) {
    Tensor loss = loss_fn();
    const double v = loss.item();
    ASSERT_TRUE(std::isfinite(v)) << name << " step " << s;
    if (s == 0) first = v;
    last = v;
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.85 * first) << name << ": loss " << first << " -> " << last << " after 9 steps on one batch";
}
}  // namespace

TEST(Models, EveryBuiltInModelFitsAFixedBatch) {
  for (const std::string& name : models::model_names()) {
    if (!models::is_builtin_model(name)) continue;  // a model another test registered
    Generator g(1);
    models::ModelConfig c;
    c.name = name;
    c.vocab = 50;
    c.image_size = 16;
    auto m = models::build_model(c, g);
    if (auto* t = dynamic_cast<models::Transformer*>(m.get())) {
      // Copy task on 2 sentences of 6 tokens: tgt_in = bos + src[:-1], target = src.
      std::vector<int64_t> src = {5, 9, 13, 7, 22, 2, 31, 8, 4, 17, 11, 2}, tin, tout = src;
      for (int b = 0; b < 2; ++b) {
        tin.push_back(1);
        for (int i = 0; i < 5; ++i) tin.push_back(src[size_t(b * 6 + i)]);
      }
      Tensor s = Tensor::from_vector(src, {2, 6}), ti = Tensor::from_vector(tin, {2, 6}),
             to = Tensor::from_vector(tout, {12});
      expect_fits(
          name,
          [&] {
        return fn::cross_entropy(fn::reshape(t->forward(s, ti), {12, 50}), to);
          },
          *m, 0.05);
    } else {
      Tensor x = Tensor::randn({8, 3, 16, 16}, g);  // small images keep the deep nets cheap
      Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 7, 3, 0, 5, 2, 9, 4}, {8});
      expect_fits(
          name, [&] { return fn::cross_entropy(m->forward(x), y); }, *m, 0.01);
    }
  }
}

// The CPU fast path keeps activations blocked between convolutions (Note [Blocked
// activations]), or NHWC where the convolutions pick it (Note [Activation layouts follow the
// convolutions]: forced here with CpuLayout::nhwc); a whole training step must still agree
// with the plain reference kernels. ResNet-20 is blocked end to end; MobileNetV2 mixes
// blocked (16, 32, 96... channels) and plain (24) tensors; forced NHWC holds every one NHWC.
TEST(Models, CpuFastPathMatchesTheReferenceKernelsOnAWholeStep) {
  for (const CpuLayout layout : {CpuLayout::automatic, CpuLayout::nhwc})
    for (const std::string name : {"resnet20", "mobilenetv2"}) {
      SCOPED_TRACE(std::string("layout ") + cpu_layout_name(layout));
      const eg::testing::CpuLayoutSetting setting(layout);
      std::vector<std::vector<float>> grads[2];
      std::vector<std::string> names;
      double loss[2];
      for (int ref = 0; ref < 2; ++ref) {
        Generator g(3);
        models::ModelConfig c;
        c.name = name;
        c.image_size = 32;
        auto m = models::build_model(c, g);
        m->train(true);
        Tensor x = Tensor::randn({8, 3, 32, 32}, g);
        Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 7, 3, 0, 2, 9, 4, 4}, {8});
        ops::set_forced_cpu_backend(ref ? int(ops::Backend::ref) : -1);
        Tensor l = fn::cross_entropy(m->forward(x), y);
        l.backward();
        ops::set_forced_cpu_backend(-1);
        loss[ref] = l.item();
        for (auto& p : m->parameters()) grads[ref].push_back(p.grad().to_vector<float>());
        if (ref == 0)
          for (auto& np : m->named_parameters()) names.push_back(np.first);
      }
      EXPECT_NEAR(loss[0], loss[1], 1e-4 * std::fabs(loss[1])) << name;
      ASSERT_EQ(grads[0].size(), grads[1].size());
      // Float summation order differs between the paths, and MobileNetV2's batch norms
      // amplify it (the plain fast path differs from ref as much as the blocked one). So:
      // the whole gradient within 1%, and each parameter's within 5% unless its gradient
      // is noise-sized (a batch norm shift followed by another batch norm has a zero
      // gradient in exact arithmetic).
      double d2all = 0, n2all = 0, biggest = 0;
      std::vector<double> d2(grads[0].size()), n2(grads[0].size());
      for (size_t k = 0; k < grads[0].size(); ++k) {
        for (size_t i = 0; i < grads[0][k].size(); ++i) {
          const double d = double(grads[0][k][i]) - double(grads[1][k][i]);
          d2[k] += d * d, n2[k] += double(grads[1][k][i]) * double(grads[1][k][i]);
        }
        d2all += d2[k], n2all += n2[k], biggest = std::max(biggest, std::sqrt(n2[k]));
      }
      EXPECT_LT(std::sqrt(d2all / n2all), 1e-2) << name;
      for (size_t k = 0; k < grads[0].size(); ++k)
        if (std::sqrt(n2[k]) > 1e-3 * biggest) {
          EXPECT_LT(std::sqrt(d2[k] / n2[k]), 5e-2) << name << " " << names[k];
        }
    }
}
