// Benchmarks generated from the op table (tests/op_cases.h): every case marked
// `bench` on every backend it supports, reporting FLOP/s or bytes/s.
// CUDA cases are registered only when a GPU is present.
#include <benchmark/benchmark.h>

#include "bench/machine_context.h"
#include "tests/op_cases.h"

using namespace eg;
using namespace eg::testing;

namespace {

void sync_device(Device d) {
  // A D2H copy of one element waits for the device's stream: keeps timings honest.
  if (d.is_cuda()) (void)Tensor::zeros({1}, DType::f32, d).to(Device::cpu());
}

void run_case(benchmark::State& st, size_t idx, ops::Backend b) {
  const OpCase& c = op_cases()[idx];
  Device dev = b == ops::Backend::cuda ? Device::cuda(0) : Device::cpu();
  Tensors in;
  for (auto& t : c.make_inputs(c.dtype)) in.push_back(t.defined() ? t.to(dev) : t);
  // An NHWC twin's conversions happen here, once: timed are the kernels a channels-last
  // network calls.
  auto nhwc = [&](Tensor& t) {
    if (b == ops::Backend::cuda && t.defined() && t.nhwc_capable()) t = t.to_format(Format::nhwc);
  };
  for (int i : c.nhwc_inputs) nhwc(in[size_t(i)]);
  Tensors out = c.forward(b, in), dout(out.size());
  for (int k : c.diff_outputs) {
    dout[size_t(k)] = randn(out[size_t(k)].shape(), out[size_t(k)].dtype(), 5).to(dev);
    if (c.nhwc_douts) nhwc(dout[size_t(k)]);
  }
  for (auto _ : st) {
    Tensors o = c.forward(b, in);
    if (c.bench_backward && c.backward) c.backward(b, in, o, dout);
    sync_device(dev);
  }
  if (c.flops > 0) st.counters["FLOP/s"] = benchmark::Counter(c.flops, benchmark::Counter::kIsIterationInvariantRate);
  if (c.bytes > 0) st.counters["B/s"] = benchmark::Counter(c.bytes, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (size_t i = 0; i < op_cases().size(); ++i) {
    const OpCase& c = op_cases()[i];
    if (!c.bench) continue;
    for (ops::Backend b : {ops::Backend::ref, ops::Backend::cpu, ops::Backend::cuda}) {
      if (!c.supports(b)) continue;
      if (b == ops::Backend::cuda && !cuda_available()) continue;
      std::string name = c.name + (c.bench_backward ? "+bwd/" : "/") + ops::backend_name(b);
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), [i, b](benchmark::State& st) { run_case(st, i, b); });
      bm->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  eg::add_machine_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
