// Image-folder input pipeline, one core: read + decode + augment of JPEGs of ImageNet's
// typical size (500 x 375, quality 90, 4:2:0, made here), to 224 x 224 floats, as the
// loader's workers do it (data::FolderSamples::load). Training (RandomResizedCrop and
// flip) with and without libjpeg-turbo's scaled decoding, and evaluation (resize 256,
// centre 224). items_per_second is images per second per core: the cores a GPU step
// needs are its images per second divided by it.
#include <benchmark/benchmark.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/image_folder.h"

using namespace eg;
namespace fs = std::filesystem;

namespace {

// 64 photos-like JPEGs (smooth shading, edges and noise, so the entropy coder has work)
// in two class folders, made once per process.
const data::ImageFolder& folder() {
  static const data::ImageFolder f = [] {
    const fs::path dir = fs::temp_directory_path() / "egeria-bench-image";
    const int w = 500, h = 375;
    tjhandle tj = tjInitCompress();
    Generator g(1);
    for (int i = 0; i < 64; ++i) {
      const fs::path cls = dir / (i % 2 ? "b" : "a");
      fs::create_directories(cls);
      std::vector<uint8_t> px(size_t(w * h * 3));
      const double fx = 0.01 + 0.002 * i, fy = 0.013 + 0.001 * i;
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          for (int c = 0; c < 3; ++c) {
            double v = 128 + 60 * std::sin(fx * x + c) * std::cos(fy * y) + ((x / 40 + y / 30) % 2 ? 30 : -30);
            v += double(g.next_u32() % 32) - 16;
            px[size_t((y * w + x) * 3 + c)] = uint8_t(std::clamp(v, 0.0, 255.0));
          }
      unsigned char* out = nullptr;
      unsigned long size = 0;
      EG_CHECK(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0) == 0, "compress");
      std::ofstream((cls / (std::to_string(i) + ".JPEG")).string(), std::ios::binary)
          .write(reinterpret_cast<char*>(out), std::streamsize(size));
      tjFree(out);
    }
    tjDestroy(tj);
    return data::scan_image_folder(dir.string());
  }();
  return f;
}

void run(benchmark::State& state, bool train, bool scaled) {
  data::FolderTransform t;
  t.train = train;
  t.scaled_decoding = scaled;
  data::FolderSamples s(folder(), t);
  std::vector<float> out(size_t(3 * 224 * 224));
  int64_t id = 0, epoch = 0;
  for (auto _ : state) {
    s.load(id, 7, epoch, out.data());
    benchmark::DoNotOptimize(out.data());
    if (++id == s.size()) id = 0, ++epoch;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_TrainImage(benchmark::State& state) { run(state, true, state.range(0) != 0); }
void BM_EvalImage(benchmark::State& state) { run(state, false, state.range(0) != 0); }

}  // namespace

BENCHMARK(BM_TrainImage)->ArgName("scaled_decoding")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EvalImage)->ArgName("scaled_decoding")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
