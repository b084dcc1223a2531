// Image-folder input pipeline, one core: read + decode + augment of JPEGs of ImageNet's
// typical size (500 x 375, quality 90, 4:2:0, made here) and of 2000 x 1500 photos, to
// 224 x 224 floats, as the loader's workers do it (data::FolderSamples::load). Training
// (RandomResizedCrop and flip) and evaluation (resize 256, centre 224), with and without
// libjpeg-turbo's scaled decoding. items_per_second is images per second per core: the
// cores a GPU step needs are its images per second divided by it. BM_Loader: the same
// through the loader with 1, 2, 4, 8 and 15 workers (as many as the machine has), to f32
// or, as a GPU run's batches, to 8-bit pixels: how it scales with the cores.
#include <benchmark/benchmark.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/image_folder.h"
#include "data/loader.h"

using namespace eg;
namespace fs = std::filesystem;

namespace {

// 64 photo-like JPEGs of w x h (smooth shading, edges and noise, so the entropy coder has
// work) in two class folders, made once per process.
const data::ImageFolder& folder(int w, int h) {
  static std::map<std::pair<int, int>, data::ImageFolder> made;
  auto it = made.find({w, h});
  if (it != made.end()) return it->second;
  const fs::path dir =
      fs::temp_directory_path() / ("egeria-bench-image-" + std::to_string(w) + "x" + std::to_string(h));
  tjhandle tj = tjInitCompress();
  Generator g(1);
  for (int i = 0; i < 64; ++i) {
    const fs::path cls = dir / (i % 2 ? "b" : "a");
    fs::create_directories(cls);
    std::vector<uint8_t> px(size_t(w) * size_t(h) * 3);
    const double fx = (0.01 + 0.002 * i) * 500 / w, fy = (0.013 + 0.001 * i) * 375 / h;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          double v = 128 + 60 * std::sin(fx * x + c) * std::cos(fy * y) +
                     ((x * 500 / w / 40 + y * 375 / h / 30) % 2 ? 30 : -30);
          v += double(g.next_u32() % 32) - 16;
          px[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] = uint8_t(std::clamp(v, 0.0, 255.0));
        }
    unsigned char* out = nullptr;
    unsigned long size = 0;
    EG_CHECK(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0) == 0, "compress");
    std::ofstream((cls / (std::to_string(i) + ".JPEG")).string(), std::ios::binary)
        .write(reinterpret_cast<char*>(out), std::streamsize(size));
    tjFree(out);
  }
  tjDestroy(tj);
  return made[{w, h}] = data::scan_image_folder(dir.string());
}

void run(benchmark::State& state, bool train) {
  const int w = int(state.range(0));
  data::FolderTransform t;
  t.train = train;
  t.scaled_decoding = state.range(1) != 0;
  data::FolderSamples s(folder(w, w * 3 / 4), t);
  std::vector<float> out(size_t(3 * 224 * 224));
  int64_t id = 0, epoch = 0;
  for (auto _ : state) {
    s.load(id, 7, epoch, out.data());
    benchmark::DoNotOptimize(out.data());
    if (++id == s.size()) id = 0, ++epoch;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_TrainImage(benchmark::State& state) { run(state, true); }
void BM_EvalImage(benchmark::State& state) { run(state, false); }

// The loader over the 500 x 375 folder (training transform, scaled decoding), batches of 16
// by `workers` threads sharing each batch, as f32 or 8-bit pixels: images per second in
// wall time, epochs of 64 images (each epoch's start, which restarts the workers,
// included).
void BM_Loader(benchmark::State& state) {
  data::FolderTransform t;
  t.train = true;
  t.scaled_decoding = true;
  data::LoaderOptions o;
  o.batch_size = 16;
  o.workers = int(state.range(0));
  o.pixels = state.range(1) != 0;
  o.seed = 7;
  data::Loader l(std::make_shared<data::FolderSamples>(folder(500, 375), t), o);
  int64_t epoch = 0, images = 0;
  l.start_epoch(epoch);
  data::Batch b;
  for (auto _ : state) {
    if (!l.next(b)) {
      l.start_epoch(++epoch);
      l.next(b);
    }
    images += b.x.size(0);
  }
  state.SetItemsProcessed(images);
}

}  // namespace

BENCHMARK(BM_TrainImage)
    ->ArgNames({"width", "scaled_decoding"})
    ->ArgsProduct({{500, 2000}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EvalImage)
    ->ArgNames({"width", "scaled_decoding"})
    ->ArgsProduct({{500, 2000}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Loader)
    ->ArgNames({"workers", "pixels"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
      for (int w : {1, 2, 4, 8, 15})
        if (w == 1 || w <= cores)
          for (int px : {0, 1}) b->Args({w, px});
    })
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
