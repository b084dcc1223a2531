#include "data/image_folder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/rng.h"

namespace eg::data {

namespace fs = std::filesystem;

namespace {

bool is_image_name(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

bool hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }

// A uniform double in [0, 1) from a 32-bit draw.
double unit(uint32_t v) { return double(v) / 4294967296.0; }

// The largest JPEG reduction (8, 4, 2) keeping a w x h region at least `need` pixels on
// each side, else 1.
int reduction_for(int64_t w, int64_t h, int64_t need) {
  for (int r : {8, 4, 2})
    if (w / r >= need && h / r >= need) return r;
  return 1;
}

}  // namespace

FolderTransform::FolderTransform() {
  const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};  // ImageNet's
  for (int c = 0; c < 3; ++c) norm.mean[c] = mean[c], norm.std[c] = sd[c];
}

int64_t FolderTransform::eval_resize() const { return int64_t(std::floor(double(size) / crop_pct + 1e-9)); }

ImageFolder scan_image_folder(const std::string& dir, const std::vector<std::string>* classes) {
  std::error_code ec;
  EG_CHECK(fs::is_directory(dir, ec), "image folder '", dir, "' is not a directory",
           ec ? " (" + ec.message() + ")" : std::string(),
           "; an image folder holds one directory per class: DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg");
  ImageFolder f;
  f.dir = dir;
  std::vector<std::string> found;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && !hidden(e.path())) found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  EG_CHECK(!found.empty(), "image folder '", dir, "' has no class folders (it needs ", dir, "/<class>/<image>)");
  if (classes) {
    for (auto& c : found)
      EG_CHECK(std::binary_search(classes->begin(), classes->end(), c), "'", dir, "' has a class '", c,
               "' that the training split does not have");
    f.classes = *classes;
  } else {
    EG_CHECK(found.size() >= 2, "image folder '", dir, "' has one class folder ('", found.front(),
             "'): a classifier learns from at least two (", dir, "/<class>/<image>, a folder per class)");
    f.classes = found;
  }
  for (auto& c : found) {
    const int64_t label = int64_t(std::lower_bound(f.classes.begin(), f.classes.end(), c) - f.classes.begin());
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(fs::path(dir) / c)) {
      if (hidden(e.path()) || !e.is_regular_file()) continue;
      if (is_image_name(e.path())) files.push_back(e.path().string());
      else ++f.left_out;
    }
    EG_CHECK(!files.empty(), "class folder '", (fs::path(dir) / c).string(),
             "' holds no images (files named *.jpg, *.jpeg or *.png)");
    std::sort(files.begin(), files.end());
    for (auto& p : files) f.files.push_back(p), f.labels.push_back(label);
  }
  return f;
}

CropDecision crop_decision(const FolderTransform& t, int64_t w, int64_t h, uint64_t seed, int64_t epoch, int64_t id) {
  CropDecision d;
  d.box = {0, 0, w, h};
  if (!t.train) return d;
  // Counter-based draws keyed by (seed, epoch, id): attempt k uses block k, the flip block 10.
  const uint64_t key = seed * 0xD1B54A32D192ED03ull ^ 0x696d61676573ull, ctr = uint64_t(epoch) << 40 ^ uint64_t(id)
                                                                                                           << 4;
  d.flip = philox4x32(key, ctr + 10).x[0] & 1u;
  // RandomResizedCrop: ten tries at a random area share and log-uniform aspect ratio,
  // else the centre crop clamped to the ratio range.
  const double area = double(w) * double(h), lr0 = std::log(t.min_ratio), lr1 = std::log(t.max_ratio);
  for (uint64_t k = 0; k < 10; ++k) {
    const Philox4 r = philox4x32(key, ctr + k);
    const double target = area * (t.min_scale + (t.max_scale - t.min_scale) * unit(r.x[0]));
    const double ratio = std::exp(lr0 + (lr1 - lr0) * unit(r.x[1]));
    const int64_t cw = std::llround(std::sqrt(target * ratio)), ch = std::llround(std::sqrt(target / ratio));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      d.box = {int64_t(r.x[3] % uint32_t(w - cw + 1)), int64_t(r.x[2] % uint32_t(h - ch + 1)), cw, ch};
      return d;
    }
  }
  const double in_ratio = double(w) / double(h);
  int64_t cw = w, ch = h;
  if (in_ratio < t.min_ratio) ch = std::llround(double(w) / t.min_ratio);
  else if (in_ratio > t.max_ratio) cw = std::llround(double(h) * t.max_ratio);
  d.box = {(w - cw) / 2, (h - ch) / 2, cw, ch};
  return d;
}

namespace {

// The transform's output pixel by pixel: put(index into [channels, size, size], channel,
// 8-bit value).
template <class Put>
void transform_pixels(const RgbImage& img, const CropDecision& d, const FolderTransform& t, Put&& put) {
  const int64_t s = t.size;
  RgbImage r;
  int64_t x0 = 0, y0 = 0;
  if (t.train) {
    r = resize(img, d.box, s, s);
  } else {  // Resize(size / crop_pct) on the short side, then CenterCrop(size)
    const int64_t short_side = t.eval_resize();
    const bool wide = img.width >= img.height;
    const int64_t rw = wide ? std::max<int64_t>(short_side, img.width * short_side / img.height) : short_side,
                  rh = wide ? short_side : std::max<int64_t>(short_side, img.height * short_side / img.width);
    r = resize(img, d.box, rw, rh);
    x0 = std::llround(double(rw - s) / 2), y0 = std::llround(double(rh - s) / 2);
  }
  for (int64_t c = 0; c < t.channels; ++c)  // grey images hold their luma in every channel
    for (int64_t y = 0; y < s; ++y)
      for (int64_t x = 0; x < s; ++x) {
        const int64_t sx = x0 + (d.flip ? s - 1 - x : x);
        put((c * s + y) * s + x, c, r.pixels[size_t(((y0 + y) * r.width + sx) * 3 + c)]);
      }
}

}  // namespace

void transform_into(const RgbImage& img, const CropDecision& d, const FolderTransform& t, float* out) {
  const PixelAffine a = pixel_affine(t.norm, t.channels);
  transform_pixels(img, d, t, [&](int64_t i, int64_t c, uint8_t p) {
    out[i] = float(p) * a.scale[size_t(c)] + a.zero[size_t(c)];
  });
}

void transform_into(const RgbImage& img, const CropDecision& d, const FolderTransform& t, uint8_t* out) {
  transform_pixels(img, d, t, [&](int64_t i, int64_t, uint8_t p) { out[i] = p; });
}

FolderSamples::FolderSamples(ImageFolder folder, FolderTransform t) : folder_(std::move(folder)), t_(t) {
  EG_CHECK(folder_.size() > 0, "image folder '", folder_.dir, "' holds no images");
  EG_CHECK(t_.size > 0, "image size must be positive, got ", t_.size);
  EG_CHECK(t_.channels == 1 || t_.channels == 3, "images have 1 (grey) or 3 (RGB) channels, not ", t_.channels);
  EG_CHECK(t_.crop_pct > 0 && t_.crop_pct <= 1,
           "the evaluation crop must be a share in (0, 1] of the resized image, got ", t_.crop_pct);
}

namespace {
// A file's own problem (unreadable, undecodable) as BadSample: the loader stops, or leaves
// the sample out (--skip-bad-images).
template <class F>
void as_bad_sample(F&& load) {
  try {
    load();
  } catch (const BadSample&) {
    throw;
  } catch (const Error& e) {
    throw BadSample(e.what());
  }
}
}  // namespace

void FolderSamples::load(int64_t id, uint64_t seed, int64_t epoch, float* out) const {
  as_bad_sample([&] { load_file(id, seed, epoch, out); });
}

void FolderSamples::load_pixels(int64_t id, uint64_t seed, int64_t epoch, uint8_t* out) const {
  as_bad_sample([&] { load_file(id, seed, epoch, out); });
}

template <class T>
void FolderSamples::load_file(int64_t id, uint64_t seed, int64_t epoch, T* out) const {
  const std::string& path = folder_.files[size_t(id)];
  const std::string bytes = read_file(path);
  const ImageSize size = image_size(bytes, path);
  CropDecision d = crop_decision(t_, size.width, size.height, seed, epoch, id);
  // The smallest JPEG decode that keeps the crop at least as large as what it becomes.
  const int64_t need = t_.train ? t_.size : t_.eval_resize();
  const int reduce =
      t_.scaled_decoding && size.format == ImageFormat::jpeg ? reduction_for(d.box.width, d.box.height, need) : 1;
  RgbImage img = decode_image(bytes, path, reduce);
  if (t_.channels == 1)  // PIL's convert("L"): L = (19595 R + 38470 G + 7471 B + 2^15) >> 16, before any resize
    for (size_t p = 0; p < img.pixels.size(); p += 3) {
      uint8_t* px = img.pixels.data() + p;
      px[0] = px[1] = px[2] = uint8_t((19595u * px[0] + 38470u * px[1] + 7471u * px[2] + 0x8000u) >> 16);
    }
  if (!t_.train) {
    d.box = {0, 0, img.width, img.height};
  } else if (reduce > 1) {  // the box in the reduced image's pixels
    Box& b = d.box;
    const int64_t x1 = std::min(img.width, (b.x + b.width) / reduce),
                  y1 = std::min(img.height, (b.y + b.height) / reduce);
    b.x = std::min(b.x / reduce, img.width - 1), b.y = std::min(b.y / reduce, img.height - 1);
    b.width = std::max<int64_t>(1, x1 - b.x), b.height = std::max<int64_t>(1, y1 - b.y);
  }
  transform_into(img, d, t_, out);
}

}  // namespace eg::data
