// The int8 reference model's costs (quant/): ConvInt8 on ResNet-56's three 3x3 layers
// (batch 128, u8 activations after a ReLU) against the f32 convolution egeria trains
// with (oneDNN) and against its own plain-loop reference (one small case: the loops
// are slow by design); and a whole reference forward of ResNet-20/56 through every
// layer module, int8 (static or per-batch scales; batch norms folded, or on the batch's
// statistics) vs fp32 — what a plasticity evaluation costs the spare cores; and
// transformer-tiny's reference (dynamically quantised linear layers) vs fp32. On a GPU
// also: the f16 convolution (cuDNN, tensor cores) against the f32 one on the same three
// layers, and ResNet-20/56's reference forward fp16-gpu vs fp32-gpu (each iteration
// ends with a one-element read back, which waits for the GPU).
// Counters: GFLOP/s of the convolutions (2*N*K*P*Q*C*R*S), images/s for the models.
#include <benchmark/benchmark.h>

#include "autograd/node.h"
#include "bench/machine_context.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "freeze/partition.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "quant/int8.h"
#include "quant/reference.h"

using namespace eg;

namespace {

struct Layer {
  const char* name;
  int64_t n, c, hw;
};
const Layer kLayers[] = {{"c16_32x32", 128, 16, 32}, {"c32_16x16", 128, 32, 16}, {"c64_8x8", 128, 64, 8}};

ops::Conv2dParams same3x3() {
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  return p;
}

Tensor relu_input(const Layer& l) {
  Generator g(1);
  Tensor x = Tensor::randn({l.n, l.c, l.hw, l.hw}, g);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::max(0.f, x.data<float>()[i]);
  return x;
}

void flops(benchmark::State& st, const Layer& l) {
  st.counters["FLOP/s"] = benchmark::Counter(2.0 * double(l.n * l.c * l.hw * l.hw * l.c * 9),
                                             benchmark::Counter::kIsIterationInvariantRate);
}

// ref: the plain-loop reference instead of oneDNN.
void BM_ConvInt8(benchmark::State& st, Layer l, bool ref) {
  Generator g(2);
  quant::ConvInt8 q(Tensor::randn({l.c, l.c, 3, 3}, g), Tensor::randn({l.c}, g), same3x3());
  Tensor x = relu_input(l);
  for (auto _ : st) benchmark::DoNotOptimize(ref ? q.forward_ref(x) : q.forward(x));
  flops(st, l);
}

void BM_ConvF32(benchmark::State& st, Layer l) {
  Generator g(2);
  Tensor w = Tensor::randn({l.c, l.c, 3, 3}, g), b = Tensor::randn({l.c}, g), x = relu_input(l);
  Tensor y = Tensor::empty({l.n, l.c, l.hw, l.hw});
  for (auto _ : st) ops::run(ops::conv2d_fwd, ops::Backend::cpu, x, w, b, y, same3x3());
  flops(st, l);
}

// Reads one element back: waits for the GPU (cheap for a CPU tensor).
void wait_for(const Tensor& t) { benchmark::DoNotOptimize(t.reshape({-1}).slice(0, 1).item()); }

// `model` for Fashion-MNIST's 1x28x28 images.
models::ModelConfig fashion_config(const char* model) {
  models::ModelConfig mc;
  mc.name = model;
  mc.in_channels = 1;
  mc.image_size = 28;
  return mc;
}

void BM_Reference(benchmark::State& st, const char* model, const char* precision) {
  const models::ModelConfig mc = fashion_config(model);
  Generator g(3);
  auto m = models::build_model(mc, g);
  // int8: static scales, calibrated before the timed iterations (Note [Static activation
  // scales]); int8-dynamic: every batch its own (--freeze-reference-calibration 0);
  // int8-bn-batch: static scales, the batch norms on each batch's statistics
  // (--freeze-reference-bn batch: unfolded, after the convolutions).
  const std::string p = precision;
  const bool dynamic = p == "int8-dynamic", bn_batch = p == "int8-bn-batch";
  auto ref = quant::make_reference(dynamic || bn_batch ? "int8" : precision, quant::model_factory(mc), m->state_dict(),
                                   Device::cuda(0), dynamic ? 0 : quant::kCalibrationBatches,
                                   bn_batch ? quant::ReferenceBn::batch : quant::ReferenceBn::running);
  const int64_t last = int64_t(m->layer_modules().size()) - 2;  // every module but the head
  Tensor x = Tensor::randn({128, 1, 28, 28}, g);  // on the CPU, as the controller passes it
  for (int64_t i = 0; i < quant::kCalibrationBatches; ++i) wait_for(ref->activation(x, last));  // calibrated
  for (auto _ : st) wait_for(ref->activation(x, last));
  st.counters["images/s"] = benchmark::Counter(128, benchmark::Counter::kIsIterationInvariantRate);
}

// One plasticity reading's reference forward for freezing unit `unit` of the paper's
// partition (ResNet-56: stem+layer1, layer2, layer3.0-2, ...): the network from the
// images through the unit (--freeze-reference-scope network), or the unit alone on
// its input (unit). On one thread, as the controller's background reference thread.
void BM_ReferenceUnit(benchmark::State& st, const char* model, int64_t unit, bool unit_scope) {
  const int threads = num_threads();
  set_num_threads(1);
  const models::ModelConfig mc = fashion_config(model);
  Generator g(3);
  auto m = models::build_model(mc, g);
  const freeze::FreezeUnit u = freeze::make_partition(*m, freeze::PartitionMode::automatic).units().at(size_t(unit));
  auto ref = quant::make_reference("int8", mc, m->state_dict());
  Tensor x = Tensor::randn({128, 1, 28, 28}, g);
  Tensor h = u.begin > 0 ? m->layer_output(x, Tensor(), u.begin - 1) : x;
  for (auto _ : st)
    wait_for(unit_scope && u.begin > 0 ? ref->activation_from(h, u.begin, u.end - 1) : ref->activation(x, u.end - 1));
  st.SetLabel(u.name);
  st.counters["images/s"] = benchmark::Counter(128, benchmark::Counter::kIsIterationInvariantRate);
  set_num_threads(threads);
}

void BM_ConvGpu(benchmark::State& st, Layer l, DType t) {
  const Device d = Device::cuda(0);
  Generator g(2);
  Tensor w = Tensor::randn({l.c, l.c, 3, 3}, g).to(t).to(d), b = Tensor::randn({l.c}, g).to(t).to(d);
  Tensor x = relu_input(l).to(t).to(d), y = Tensor::empty({l.n, l.c, l.hw, l.hw}, t, d);
  for (auto _ : st) {
    ops::call(ops::conv2d_fwd, x, w, b, y, same3x3());
    wait_for(y);
  }
  flops(st, l);
}

// transformer-tiny (d 512, 2+2 layers, vocabulary 8000), 64 sentences of 32 tokens a
// side: the reference up to the last decoder layer (dynamically quantised linear
// layers vs f32).
void BM_ReferenceTransformer(benchmark::State& st, const char* precision) {
  models::ModelConfig mc;
  mc.name = "transformer-tiny";
  Generator g(3);
  auto m = models::build_model(mc, g);
  auto ref = quant::make_reference(precision, mc, m->state_dict());
  const int64_t b = 64, t = 32, last = int64_t(m->layer_modules().size()) - 2;  // every module but the head
  std::vector<int64_t> ids(size_t(b * t));
  for (auto& v : ids) v = 4 + int64_t(g.next_u32() % 7990);
  Tensor src = Tensor::from_vector(ids, {b, t}), tgt = Tensor::from_vector(ids, {b, t});
  for (auto _ : st) benchmark::DoNotOptimize(ref->activation(src, last, tgt));
  st.counters["tokens/s"] = benchmark::Counter(double(b * t), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Layer& l : kLayers) {
    benchmark::RegisterBenchmark((std::string("conv_int8/") + l.name).c_str(), BM_ConvInt8, l, false)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("conv_f32/") + l.name).c_str(), BM_ConvF32, l)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("conv_int8_ref/c16_16x16_b8", BM_ConvInt8, Layer{"c16_16x16_b8", 8, 16, 16}, true)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("conv_int8/c16_16x16_b8", BM_ConvInt8, Layer{"c16_16x16_b8", 8, 16, 16}, false)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (const char* model : {"resnet20", "resnet56", "mobilenetv2"})
    for (const char* prec : {"int8", "int8-dynamic", "int8-bn-batch", "fp32"})
      benchmark::RegisterBenchmark((std::string("reference/") + model + "_b128/" + prec).c_str(), BM_Reference, model,
                                   prec)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (const char* model : {"resnet20", "resnet56"}) {
    Generator g(3);
    // Every unit but the first (whose input is the images) and the head (never evaluated).
    const int64_t units =
        freeze::make_partition(*models::build_model(fashion_config(model), g), freeze::PartitionMode::automatic).size();
    for (int64_t u = 1; u + 1 < units; ++u)
      for (bool unit_scope : {false, true})
        benchmark::RegisterBenchmark((std::string("reference_reading/") + model + "_b128/unit" + std::to_string(u) +
                                      (unit_scope ? "/unit_scope" : "/network_scope"))
                                         .c_str(),
                                     BM_ReferenceUnit, model, u, unit_scope)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  }
  for (const char* prec : {"int8", "fp32"})
    benchmark::RegisterBenchmark((std::string("reference/transformer-tiny_b64x32/") + prec).c_str(),
                                 BM_ReferenceTransformer, prec)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  if (cuda_available()) {
    for (const Layer& l : kLayers)
      for (DType t : {DType::f16, DType::f32})
        benchmark::RegisterBenchmark((std::string("conv_gpu_") + dtype_name(t) + "/" + l.name).c_str(), BM_ConvGpu, l,
                                     t)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    for (const char* model : {"resnet20", "resnet56"})
      for (const char* prec : {"fp16-gpu", "fp32-gpu"})
        benchmark::RegisterBenchmark((std::string("reference/") + model + "_b128/" + prec).c_str(), BM_Reference, model,
                                     prec)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  }
  eg::add_machine_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
