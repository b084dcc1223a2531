// Greedy decoding of a Transformer (models/transformer.h), as translation's evaluation
// runs it for BLEU: transformer-tiny or -small, 64 sentences of 40 source tokens, up to
// 58 target tokens (evaluation's limit for that length). Random weights never emit eos,
// so every sentence decodes to the limit: the worst case, and the same work every run.
//   GreedyDecode/<model>            Transformer::greedy_decode, one position a step with
//                                   each layer's keys and values cached (Note
//                                   [Incremental decoding])
//   GreedyDecodeRecompute/<model>   the same tokens by re-running the decoder over the
//                                   whole prefix at each step, as before 2026-11-29 (the
//                                   baseline of the ratio)
// Counter tok/s: target tokens decoded a second. EG_BENCH_DEVICE=cuda:0 runs on a GPU.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/rng.h"
#include "models/transformer.h"

using namespace eg;

namespace {

constexpr int64_t kBatch = 64, kSrcLen = 40, kMaxLen = kSrcLen + kSrcLen / 5 + 10;

Device bench_device() {
  const char* d = std::getenv("EG_BENCH_DEVICE");
  return d && *d ? Device::parse(d) : Device::cpu();
}

struct Setup {
  std::unique_ptr<models::Transformer> m;
  Tensor src;
};

Setup make(const char* name) {
  Generator g(1);
  Setup s;
  s.m = std::make_unique<models::Transformer>(models::transformer_preset(name, 8000), g);
  s.m->eval();
  std::vector<int64_t> ids(size_t(kBatch * kSrcLen));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 3 + int64_t((i * 7919) % 7997);
  const Device dev = bench_device();
  if (!dev.is_cpu()) s.m->to(dev);
  s.src = Tensor::from_vector(ids, {kBatch, kSrcLen}, dev);
  return s;
}

void BM_GreedyDecode(benchmark::State& st, const char* name) {
  Setup s = make(name);
  int64_t tokens = 0;
  for (auto _ : st) {
    const auto out = s.m->greedy_decode(s.src, kMaxLen);
    for (const auto& o : out) tokens += int64_t(o.size());
  }
  st.counters["tok/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
}

// Each step re-runs the decoder over bos and every token so far and takes the last
// position's argmax: what greedy_decode did before it cached keys and values.
void BM_GreedyDecodeRecompute(benchmark::State& st, const char* name) {
  Setup s = make(name);
  const models::TransformerConfig& c = s.m->config();
  int64_t tokens = 0;
  for (auto _ : st) {
    autograd::NoGradGuard ng;
    Tensor src_mask;
    const Tensor memory = s.m->encode(s.src, src_mask);
    std::vector<int64_t> prefix(size_t(kBatch), c.bos_id);  // [B, t + 1], row-major
    for (int64_t t = 0; t < kMaxLen; ++t) {
      const Tensor tgt = Tensor::from_vector(prefix, {kBatch, t + 1}, s.src.device());
      const std::vector<int64_t> best = fn::argmax(s.m->decode(memory, src_mask, tgt)).to_vector<int64_t>();
      std::vector<int64_t> next;
      for (int64_t i = 0; i < kBatch; ++i) {
        next.insert(next.end(), prefix.begin() + i * (t + 1), prefix.begin() + (i + 1) * (t + 1));
        next.push_back(best[size_t(i * (t + 1) + t)]);
      }
      prefix.swap(next);
      tokens += kBatch;
    }
  }
  st.counters["tok/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : {"transformer-tiny", "transformer-small"}) {
    benchmark::RegisterBenchmark((std::string("GreedyDecode/") + name).c_str(), BM_GreedyDecode, name)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("GreedyDecodeRecompute/") + name).c_str(), BM_GreedyDecodeRecompute, name)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
