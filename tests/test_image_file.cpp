// Image files (data/image_file.h): real JPEG and PNG files of every mode, written here
// with libjpeg(-turbo) and libpng, decoded back as PIL would; the errors of bad files;
// the antialiased bilinear resize.
#include <gtest/gtest.h>
// clang-format off
#include <cstdio>  // jpeglib.h needs FILE first
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/image_file.h"
#include "tests/test_util.h"

using namespace eg;

namespace {

// A smooth test pattern (JPEG keeps it within a few levels), c channels.
std::vector<uint8_t> pattern(int w, int h, int c) {
  std::vector<uint8_t> v(size_t(w * h * c));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) v[size_t((y * w + x) * c + k)] = uint8_t((x * 7 + y * 3 + k * 60) % 200 + 20);
  return v;
}

std::string tj_jpeg(const std::vector<uint8_t>& px, int w, int h, int pf, int subsamp) {
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, pf, &out, &size, subsamp, 100, 0), 0) << tjGetErrorStr2(tj);
  std::string s(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return s;
}

// A CMYK JPEG through libjpeg's own API, with or without Adobe's APP14 marker.
std::string cmyk_jpeg(const std::vector<uint8_t>& px, int w, int h, bool adobe) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = JDIMENSION(w), c.image_height = JDIMENSION(h);
  c.input_components = 4;
  c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, JCS_CMYK);
  jpeg_set_quality(&c, 100, TRUE);
  for (int i = 0; i < 4; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  c.write_Adobe_marker = adobe ? TRUE : FALSE;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(px.data() + size_t(c.next_scanline) * size_t(w) * 4);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string s(reinterpret_cast<char*>(out), size);
  std::free(out);
  return s;
}

// A PNG of the given libpng colour type and bit depth; `samples` holds one value per
// channel per pixel (16-bit ones big-endian, as PNG stores them, two bytes each).
std::string png_file(const std::string& path, int w, int h, int color, int depth, const std::vector<uint8_t>& samples,
                     const std::vector<png_color>& palette = {}, const std::vector<uint8_t>& trns = {}) {
  FILE* f = std::fopen(path.c_str(), "wb");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), depth, color, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), int(palette.size()));
  if (!trns.empty()) png_set_tRNS(png, info, trns.data(), int(trns.size()), nullptr);
  png_write_info(png, info);
  const size_t row = samples.size() / size_t(h);
  for (int y = 0; y < h; ++y) png_write_row(png, samples.data() + size_t(y) * row);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
  return data::read_file(path);
}

int max_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 1000;
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

// PIL's CMYK to RGB: (255 - k) - (255 - k) * c / 255, rounded.
std::vector<uint8_t> cmyk_to_rgb(const std::vector<uint8_t>& cmyk, bool invert) {
  std::vector<uint8_t> rgb;
  for (size_t i = 0; i < cmyk.size(); i += 4) {
    auto v = [&](size_t k) { return invert ? 255 - int(cmyk[i + k]) : int(cmyk[i + k]); };
    const int nk = 255 - v(3);
    for (size_t k = 0; k < 3; ++k) rgb.push_back(uint8_t(nk - int(std::lround(v(k) * nk / 255.0))));
  }
  return rgb;
}

std::string error_of(const std::string& bytes, const std::string& path, int reduce = 1) {
  try {
    data::decode_image(bytes, path, reduce);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ImageFile, JpegsOfEveryModeDecodeToRgbAsPilDoes) {
  const int w = 40, h = 24;
  // RGB, 4:4:4 at quality 100: within a few levels of what was written.
  const auto rgb = pattern(w, h, 3);
  const std::string jpg = tj_jpeg(rgb, w, h, TJPF_RGB, TJSAMP_444);
  ASSERT_EQ(data::image_format(jpg), data::ImageFormat::jpeg);
  auto img = data::decode_image(jpg, "rgb.jpg");
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.height, h);
  EXPECT_LE(max_diff(img.pixels, rgb), 3);
  const auto size = data::image_size(jpg, "rgb.jpg");
  EXPECT_EQ(size.width, w);
  EXPECT_EQ(size.height, h);
  // Grey: the value in all three channels.
  const auto grey = pattern(w, h, 1);
  img = data::decode_image(tj_jpeg(grey, w, h, TJPF_GRAY, TJSAMP_GRAY), "grey.jpg");
  std::vector<uint8_t> grey3;
  for (uint8_t g : grey) grey3.insert(grey3.end(), {g, g, g});
  EXPECT_LE(max_diff(img.pixels, grey3), 2);
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    ASSERT_EQ(img.pixels[i], img.pixels[i + 1]);
    ASSERT_EQ(img.pixels[i], img.pixels[i + 2]);
  }
  // CMYK, plain and with Adobe's marker (whose samples PIL reads inverted).
  const auto cmyk = pattern(w, h, 4);
  for (bool adobe : {false, true}) {
    img = data::decode_image(cmyk_jpeg(cmyk, w, h, adobe), "cmyk.jpg");
    EXPECT_LE(max_diff(img.pixels, cmyk_to_rgb(cmyk, adobe)), 4) << "adobe " << adobe;
  }
  // Scaled decoding: each side 1/k, rounded up.
  for (int k : {2, 4, 8}) {
    img = data::decode_image(jpg, "rgb.jpg", k);
    EXPECT_EQ(img.width, (w + k - 1) / k);
    EXPECT_EQ(img.height, (h + k - 1) / k);
  }
}

TEST(ImageFile, PngsOfEveryModeDecodeToRgbAsPilDoes) {
  const std::string d = eg::testing::fresh_dir("png_modes");
  const int w = 7, h = 5;
  const auto rgb = pattern(w, h, 3), grey = pattern(w, h, 1);
  auto decode = [&](const std::string& bytes) { return data::decode_image(bytes, "x.png").pixels; };
  std::vector<uint8_t> grey3;
  for (uint8_t g : grey) grey3.insert(grey3.end(), {g, g, g});
  EXPECT_EQ(decode(png_file(d + "/rgb.png", w, h, PNG_COLOR_TYPE_RGB, 8, rgb)), rgb);
  EXPECT_EQ(decode(png_file(d + "/grey.png", w, h, PNG_COLOR_TYPE_GRAY, 8, grey)), grey3);
  // Alpha dropped: RGBA keeps its RGB, grey+alpha its grey.
  std::vector<uint8_t> rgba, ga;
  for (size_t i = 0; i < grey.size(); ++i) {
    rgba.insert(rgba.end(), {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], uint8_t(i * 9)});
    ga.insert(ga.end(), {grey[i], uint8_t(255 - i)});
  }
  EXPECT_EQ(decode(png_file(d + "/rgba.png", w, h, PNG_COLOR_TYPE_RGBA, 8, rgba)), rgb);
  EXPECT_EQ(decode(png_file(d + "/ga.png", w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga)), grey3);
  // 16-bit: the high byte, so a 16-bit file equals its 8-bit version.
  std::vector<uint8_t> rgb16, grey16;
  for (uint8_t v : rgb) rgb16.insert(rgb16.end(), {v, uint8_t(v ^ 0x5A)});  // any low byte
  for (uint8_t v : grey) grey16.insert(grey16.end(), {v, 0xFF});
  EXPECT_EQ(decode(png_file(d + "/rgb16.png", w, h, PNG_COLOR_TYPE_RGB, 16, rgb16)), rgb);
  EXPECT_EQ(decode(png_file(d + "/grey16.png", w, h, PNG_COLOR_TYPE_GRAY, 16, grey16)), grey3);
  // Palette, with a transparency entry PIL's convert("RGB") ignores.
  std::vector<png_color> pal = {{10, 20, 30}, {200, 100, 0}, {0, 255, 128}};
  std::vector<uint8_t> idx, expect;
  for (int i = 0; i < w * h; ++i) {
    idx.push_back(uint8_t(i % 3));
    expect.insert(expect.end(), {pal[size_t(i % 3)].red, pal[size_t(i % 3)].green, pal[size_t(i % 3)].blue});
  }
  EXPECT_EQ(decode(png_file(d + "/pal.png", w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, pal, {0, 128, 255})), expect);
  // 1-bit grey: 0 and 255. Rows are packed, 8 pixels a byte, most significant bit first.
  std::vector<uint8_t> bits, expect1;
  for (int y = 0; y < h; ++y) {
    uint8_t byte = 0;
    for (int x = 0; x < w; ++x) {
      const bool on = (x + y) % 2 == 0;
      byte = uint8_t(byte | (on ? 0x80 >> x : 0));
      expect1.insert(expect1.end(), 3, on ? 255 : 0);
    }
    bits.push_back(byte);
  }
  EXPECT_EQ(decode(png_file(d + "/bits.png", w, h, PNG_COLOR_TYPE_GRAY, 1, bits)), expect1);
}

TEST(ImageFile, BadFilesAreNamedErrors) {
  const std::string d = eg::testing::fresh_dir("bad_images");
  const int w = 64, h = 48;
  const std::string jpg = tj_jpeg(pattern(w, h, 3), w, h, TJPF_RGB, TJSAMP_420);
  // Truncated: PIL's "image file is truncated".
  std::string e = error_of(jpg.substr(0, jpg.size() / 2), "cut.jpg");
  EXPECT_NE(e.find("'cut.jpg' is truncated"), std::string::npos) << e;
  // A text file named .jpg.
  e = error_of("<!DOCTYPE html>\n", "page.jpg");
  EXPECT_NE(e.find("'page.jpg' is neither a JPEG nor a PNG file: it starts with 3c 21 44 4f"), std::string::npos) << e;
  e = error_of("", "empty.jpg");
  EXPECT_NE(e.find("nothing (the file is empty)"), std::string::npos) << e;
  // A PNG named .JPEG (ImageNet has one) decodes by its content.
  const auto rgb = pattern(5, 4, 3);
  const std::string png = png_file(d + "/n02105855_2933.JPEG", 5, 4, PNG_COLOR_TYPE_RGB, 8, rgb);
  EXPECT_EQ(data::decode_image(png, d + "/n02105855_2933.JPEG").pixels, rgb);
  // A truncated PNG, and a PNG whose data is damaged: libpng's error, through no C++ frame.
  e = error_of(png.substr(0, png.size() - 20), "cut.png");
  EXPECT_NE(e.find("'cut.png' cannot be decoded as a PNG"), std::string::npos) << e;
  std::string bad = png;
  bad[40] = char(bad[40] ^ 0x55);
  e = error_of(bad, "damaged.png");
  EXPECT_NE(e.find("'damaged.png' cannot be decoded as a PNG"), std::string::npos) << e;
  // An absurd size is refused before decoding (a PNG header claiming 100000 x 100000).
  std::string huge = png;
  for (int at : {16, 20})
    huge[size_t(at)] = 0, huge[size_t(at) + 1] = char(0x01), huge[size_t(at) + 2] = char(0x86),
    huge[size_t(at) + 3] = char(0xA0);
  e = error_of(huge, "bomb.png");
  EXPECT_NE(e.find("'bomb.png': 100000x100000 is 10000000000 pixels, more than"), std::string::npos) << e;
  try {
    data::read_file(d + "/missing.jpg");
    ADD_FAILURE();
  } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("missing.jpg"), std::string::npos);
  }
  // A folder where a file was expected is an error naming it; a pipe (no size to ask for)
  // and an empty file are read whole.
  try {
    data::read_file(d);
    ADD_FAILURE() << "a folder was read";
  } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find(d), std::string::npos) << ex.what();
  }
  const std::string fifo = d + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << png; });
  EXPECT_EQ(data::read_file(fifo), png);
  writer.join();
  std::ofstream(d + "/empty.jpg").close();
  EXPECT_EQ(data::read_file(d + "/empty.jpg"), "");
}

namespace {

// The resize's sums written plainly: each output sample's triangle-filter taps, in order,
// as one chain of fused multiply-adds in f32, horizontally (rows of the box) and then
// vertically, rounded half away from zero into a byte.
data::RgbImage plain_resize(const data::RgbImage& src, const data::Box& b, int64_t out_w, int64_t out_h) {
  struct Axis {
    std::vector<int64_t> first;
    std::vector<std::vector<float>> w;
  };
  auto axis = [](int64_t in, int64_t out) {
    const double scale = double(in) / double(out), widen = std::max(scale, 1.0);
    Axis a;
    for (int64_t o = 0; o < out; ++o) {
      const double center = (double(o) + 0.5) * scale;
      const int64_t lo = std::max<int64_t>(0, int64_t(center - widen + 0.5)),
                    hi = std::min<int64_t>(in, int64_t(center + widen + 0.5));
      std::vector<float> w;
      double total = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const double d = std::abs((double(i) + 0.5 - center) / widen);
        w.push_back(float(d < 1 ? 1 - d : 0));
        total += w.back();
      }
      for (auto& v : w) v = total > 0 ? float(v / total) : 0.f;
      a.first.push_back(lo);
      a.w.push_back(w);
    }
    return a;
  };
  const Axis ax = axis(b.width, out_w), ay = axis(b.height, out_h);
  std::vector<float> mid(size_t(b.height * out_w * 3));
  for (int64_t y = 0; y < b.height; ++y)
    for (int64_t o = 0; o < out_w; ++o)
      for (int64_t c = 0; c < 3; ++c) {
        float acc = 0;
        for (size_t k = 0; k < ax.w[size_t(o)].size(); ++k)
          acc = std::fma(
              ax.w[size_t(o)][k],
              float(src.pixels[size_t(((b.y + y) * src.width + b.x + ax.first[size_t(o)] + int64_t(k)) * 3 + c)]), acc);
        mid[size_t((y * out_w + o) * 3 + c)] = acc;
      }
  data::RgbImage out;
  out.width = out_w, out.height = out_h;
  for (int64_t o = 0; o < out_h; ++o)
    for (int64_t x = 0; x < out_w * 3; ++x) {
      float acc = 0;
      for (size_t k = 0; k < ay.w[size_t(o)].size(); ++k)
        acc = std::fma(ay.w[size_t(o)][k], mid[size_t((ay.first[size_t(o)] + int64_t(k)) * out_w * 3 + x)], acc);
      out.pixels.push_back(uint8_t(std::clamp(std::lround(acc), 0L, 255L)));
    }
  return out;
}

}  // namespace

// The resize's vectorised passes (padded tap tables, a gather of each row's inputs) give
// the plain sums' bytes exactly: shrinking, enlarging, boxes of one pixel, images of
// noise, ramps and stripes.
TEST(ImageFile, ResizeGivesThePlainSumsBitForBit) {
  std::mt19937 g(7);
  for (int t = 0; t < 300; ++t) {
    data::RgbImage img;
    img.width = 1 + int64_t(g() % 300), img.height = 1 + int64_t(g() % 200);
    const int kind = int(g() % 3);
    for (int64_t i = 0; i < img.width * img.height * 3; ++i)
      img.pixels.push_back(kind == 0 ? uint8_t(g()) : kind == 1 ? uint8_t((i / 3) % 256) : uint8_t((i / 3) % 2 * 255));
    data::Box b;
    b.width = 1 + int64_t(g() % uint32_t(img.width)), b.height = 1 + int64_t(g() % uint32_t(img.height));
    b.x = int64_t(g() % uint32_t(img.width - b.width + 1)), b.y = int64_t(g() % uint32_t(img.height - b.height + 1));
    const int64_t w = 1 + int64_t(g() % 240), h = 1 + int64_t(g() % 240);
    ASSERT_EQ(data::resize(img, b, w, h).pixels, plain_resize(img, b, w, h).pixels)
        << img.width << "x" << img.height << " box " << b.x << "," << b.y << " " << b.width << "x" << b.height << " to "
        << w << "x" << h;
  }
}

TEST(ImageFile, ResizeIsAntialiasedBilinear) {
  data::RgbImage img;
  img.width = 8, img.height = 4;
  // A one-pixel checkerboard: shrunk by 2 with antialiasing, every pixel away from the
  // left and right edges is the mean (a point-sampling resize would keep one colour).
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) img.pixels.insert(img.pixels.end(), 3, (x + y) % 2 ? 200 : 0);
  auto half = data::resize(img, {0, 0, 8, 4}, 4, 2);
  for (int y = 0; y < 2; ++y)
    for (int x = 1; x < 3; ++x) EXPECT_EQ(half.pixels[size_t((y * 4 + x) * 3)], 100) << x << "," << y;
  // The same size: unchanged. A box: only its pixels are read.
  EXPECT_EQ(data::resize(img, {0, 0, 8, 4}, 8, 4).pixels, img.pixels);
  auto one = data::resize(img, {1, 0, 1, 1}, 3, 3);
  for (uint8_t v : one.pixels) EXPECT_EQ(v, 200);
  // Enlarging a ramp by 2: bilinear interpolation between the samples' centres.
  data::RgbImage ramp;
  ramp.width = 2, ramp.height = 1;
  ramp.pixels = {0, 0, 0, 100, 100, 100};
  auto up = data::resize(ramp, {0, 0, 2, 1}, 4, 1);
  EXPECT_EQ(up.pixels[0], 0);  // at 0.25: clamped to the first centre
  EXPECT_EQ(up.pixels[3], 25);  // at 0.75
  EXPECT_EQ(up.pixels[6], 75);
  EXPECT_EQ(up.pixels[9], 100);
  try {
    data::resize(img, {4, 0, 8, 4}, 2, 2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside a 8x4 image"), std::string::npos) << e.what();
  }
}
