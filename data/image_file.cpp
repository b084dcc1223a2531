#include "data/image_file.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace eg::data {

namespace {

const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

const uint8_t* bytes_of(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// "ff d8 3c 21" for an error about what a file starts with.
std::string first_bytes(const std::string& s) {
  std::string r;
  char buf[4];
  for (size_t i = 0; i < std::min<size_t>(s.size(), 8); ++i) {
    std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", unsigned(uint8_t(s[i])));
    r += buf;
  }
  return r.empty() ? "nothing (the file is empty)" : r;
}

void check_pixels(int64_t w, int64_t h, const std::string& path) {
  EG_CHECK(w > 0 && h > 0, "'", path, "': an image of ", w, "x", h, " pixels");
  EG_CHECK(w * h <= kMaxImagePixels, "'", path, "': ", w, "x", h, " is ", w * h, " pixels, more than the ",
           kMaxImagePixels, " an image may have (a decompression bomb, or not an image meant for training)");
}

// ---- JPEG

struct TjHandle {
  TjHandle() : h(tjInitDecompress()) { EG_CHECK(h, "libjpeg-turbo: cannot create a decompressor"); }
  ~TjHandle() { tjDestroy(h); }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle h;
};

// Whether the JPEG carries Adobe's APP14 marker (its CMYK samples are then inverted).
bool has_adobe_marker(const std::string& s) {
  const uint8_t* d = bytes_of(s);
  size_t pos = 2;
  while (pos + 4 <= s.size()) {
    if (d[pos] != 0xFF) return false;
    const uint8_t m = d[pos + 1];
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (m == 0xDA || m == 0xD9) return false;  // start of scan / end of image: no more headers
    const size_t len = size_t(d[pos + 2]) << 8 | d[pos + 3];
    if (m == 0xEE && len >= 7 && pos + 4 + 5 <= s.size() && std::memcmp(d + pos + 4, "Adobe", 5) == 0) return true;
    pos += 2 + len;
  }
  return false;
}

// round(a * b / 255) for a, b in [0, 255], exactly, in integers.
int mul_div255(int a, int b) {
  const int t = a * b + 128;
  return (t + (t >> 8)) >> 8;
}

RgbImage decode_jpeg(const std::string& bytes, const std::string& path, int reduce) {
  TjHandle tj;
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* data = const_cast<unsigned char*>(bytes_of(bytes));
  const unsigned long size = static_cast<unsigned long>(bytes.size());
  if (tjDecompressHeader3(tj.h, data, size, &w, &h, &subsamp, &colorspace) != 0)
    EG_THROW("'", path, "' is not a readable JPEG: ", tjGetErrorStr2(tj.h));
  check_pixels(w, h, path);
  const tjscalingfactor sf{1, reduce};
  const int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::vector<uint8_t> buf(size_t(sw) * size_t(sh) * (cmyk ? 4 : 3));
  if (tjDecompress2(tj.h, data, size, buf.data(), sw, 0, sh, cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0) {
    const std::string why = tjGetErrorStr2(tj.h);
    // A warning leaves a decoded image: PIL loads those, except a file that ends early.
    EG_CHECK(tjGetErrorCode(tj.h) == TJERR_WARNING, "'", path, "' cannot be decoded as a JPEG: ", why);
    EG_CHECK(why.find("Premature end") == std::string::npos, "'", path, "' is truncated (", why, ")");
  }
  RgbImage img;
  img.width = sw, img.height = sh;
  if (!cmyk) {
    img.pixels = std::move(buf);
    return img;
  }
  const bool inverted = has_adobe_marker(bytes);
  img.pixels.resize(size_t(sw) * size_t(sh) * 3);
  for (size_t i = 0, n = size_t(sw) * size_t(sh); i < n; ++i) {
    int c[4];
    for (int k = 0; k < 4; ++k) c[k] = inverted ? 255 - buf[4 * i + size_t(k)] : buf[4 * i + size_t(k)];
    const int nk = 255 - c[3];
    for (int k = 0; k < 3; ++k) img.pixels[3 * i + size_t(k)] = uint8_t(std::clamp(nk - mul_div255(c[k], nk), 0, 255));
  }
  return img;
}

// ---- PNG. See Note [Decoding as PIL does] for why this part is plain C.

struct PngRead {
  const uint8_t* data;
  size_t size, pos;
  uint8_t* pixels;  // malloc'ed, width x height x 3
  png_uint_32 width, height;
  long long max_pixels;
  char error[256];
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  PngRead* r = static_cast<PngRead*>(png_get_io_ptr(png));
  if (r->size - r->pos < n) png_error(png, "the file ends before the image does (truncated)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  PngRead* r = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(r->error, sizeof r->error, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // PIL loads those files too

// 0 on success, with r->pixels filled; else r->error says why and nothing is allocated.
int decode_png_c(PngRead* r) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(r->error, sizeof r->error, "libpng cannot start");
    return 1;
  }
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(r->error, sizeof r->error, "libpng cannot start");
    return 1;
  }
  png_bytep* volatile rows = nullptr;
  if (setjmp(png_jmpbuf(png))) {  // a libpng error: r->error says which
    png_destroy_read_struct(&png, &info, nullptr);
    std::free(rows);
    std::free(r->pixels);
    r->pixels = nullptr;
    return 1;
  }
  png_set_read_fn(png, r, png_read_bytes);
  png_read_info(png, info);
  r->width = png_get_image_width(png, info);
  r->height = png_get_image_height(png, info);
  if ((long long)r->width * (long long)r->height > r->max_pixels) png_error(png, "too many pixels");
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (depth == 16) png_set_strip_16(png);  // the high byte
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  // Alpha dropped, including what a palette's transparency entries expand to.
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(r->width) * 3) {
    std::snprintf(r->error, sizeof r->error, "%zu bytes a row after conversion, not %zu (colour type %d, depth %d)",
                  size_t(png_get_rowbytes(png, info)), size_t(r->width) * 3, color, depth);
    png_longjmp(png, 1);
  }
  r->pixels = static_cast<uint8_t*>(std::malloc(size_t(r->width) * r->height * 3));
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * r->height));
  if (!r->pixels || !rows) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < r->height; ++y) rows[y] = r->pixels + size_t(y) * r->width * 3;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  std::free(rows);
  return 0;
}

RgbImage decode_png(const std::string& bytes, const std::string& path) {
  image_size(bytes, path);  // refuses an absurd size from the header alone
  PngRead r{bytes_of(bytes), bytes.size(), 0, nullptr, 0, 0, kMaxImagePixels, {0}};
  const int rc = decode_png_c(&r);
  if (rc != 0 && std::strcmp(r.error, "too many pixels") == 0) check_pixels(r.width, r.height, path);
  EG_CHECK(rc == 0, "'", path, "' cannot be decoded as a PNG: ", r.error);
  RgbImage img;
  img.width = r.width, img.height = r.height;
  img.pixels.assign(r.pixels, r.pixels + size_t(r.width) * r.height * 3);
  std::free(r.pixels);
  return img;
}

// ---- resampling

// One axis of an antialiased bilinear resize: output sample o reads count[o] inputs from
// first[o], with the normalised weights w[k * out + o], k < count[o]; the table is padded
// to k < most for every sample (weight 0, the input index held inside the axis), so a
// pass can run every sample through the same taps: an added 0 x input leaves a sum as it
// was, and each sample's own taps come in the same order.
struct Taps {
  int64_t most = 0;  // the most inputs a sample reads
  std::vector<int64_t> first, count;
  std::vector<float> w;  // [most][out]
  int64_t input(int64_t o, int64_t k, int64_t in) const { return std::min(first[size_t(o)] + k, in - 1); }
};

Taps taps(int64_t in, int64_t out) {
  const double scale = double(in) / double(out), widen = std::max(scale, 1.0), support = widen;  // triangle: radius 1
  Taps t;
  std::vector<std::vector<float>> ws;
  for (int64_t o = 0; o < out; ++o) {
    const double center = (double(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, int64_t(center - support + 0.5)),
                  hi = std::min<int64_t>(in, int64_t(center + support + 0.5));
    std::vector<float> w;
    double total = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double d = std::abs((double(i) + 0.5 - center) / widen);
      w.push_back(float(d < 1 ? 1 - d : 0));
      total += w.back();
    }
    for (auto& v : w) v = total > 0 ? float(v / total) : 0.f;
    t.first.push_back(lo);
    t.count.push_back(int64_t(w.size()));
    t.most = std::max(t.most, int64_t(w.size()));
    ws.push_back(std::move(w));
  }
  t.w.assign(size_t(t.most * out), 0.f);
  for (int64_t o = 0; o < out; ++o)
    for (size_t k = 0; k < ws[size_t(o)].size(); ++k) t.w[k * size_t(out) + size_t(o)] = ws[size_t(o)][k];
  return t;
}

// Sums rounded half away from zero, as std::lround rounds, and clamped to a byte: for the
// sums here (at least 0, at most 255 and a few ulps) floor(a + 0.5) in double is lround's
// result (the addition is exact, or for a below 2^-30 rounds to 0.5, whose floor is 0
// too), and truncation is floor. Written without a float comparison, which the compiler
// does not vectorise under IEEE exception semantics.
void to_bytes(const float* sums, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = uint8_t(std::min(std::max(int32_t(double(sums[i]) + 0.5), 0), 255));
}

}  // namespace

ImageFormat image_format(const std::string& b) {
  if (b.size() >= 3 && uint8_t(b[0]) == 0xFF && uint8_t(b[1]) == 0xD8 && uint8_t(b[2]) == 0xFF)
    return ImageFormat::jpeg;
  if (b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

ImageSize image_size(const std::string& bytes, const std::string& path) {
  ImageSize s;
  s.format = image_format(bytes);
  if (s.format == ImageFormat::jpeg) {
    TjHandle tj;
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj.h, const_cast<unsigned char*>(bytes_of(bytes)), static_cast<unsigned long>(bytes.size()),
                            &w, &h, &subsamp, &colorspace) != 0)
      EG_THROW("'", path, "' is not a readable JPEG: ", tjGetErrorStr2(tj.h));
    s.width = w, s.height = h;
  } else if (s.format == ImageFormat::png) {
    // IHDR is the first chunk: width and height big-endian at bytes 16..23.
    EG_CHECK(bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0, "'", path,
             "' cannot be decoded as a PNG: no IHDR header");
    const uint8_t* d = bytes_of(bytes);
    auto be32 = [&](size_t at) { return int64_t(d[at]) << 24 | int64_t(d[at + 1]) << 16 | d[at + 2] << 8 | d[at + 3]; };
    s.width = be32(16), s.height = be32(20);
  } else {
    EG_THROW("'", path, "' is neither a JPEG nor a PNG file: it starts with ", first_bytes(bytes));
  }
  check_pixels(s.width, s.height, path);
  return s;
}

RgbImage decode_image(const std::string& bytes, const std::string& path, int reduce) {
  EG_CHECK(reduce == 1 || reduce == 2 || reduce == 4 || reduce == 8, "decode_image: reduce must be 1, 2, 4 or 8, got ",
           reduce);
  switch (image_format(bytes)) {
    case ImageFormat::jpeg: return decode_jpeg(bytes, path, reduce);
    case ImageFormat::png: return decode_png(bytes, path);
    case ImageFormat::unknown: break;
  }
  EG_THROW("'", path, "' is neither a JPEG nor a PNG file: it starts with ", first_bytes(bytes));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EG_CHECK(f, "cannot open '", path, "': ", std::strerror(errno));
  // A regular file in one read of the size it has (a character at a time through a stream
  // iterator cost a loader worker 2% of its time), then whatever is left in chunks: all
  // of a file of unknown size (a pipe), or one that grew meanwhile.
  std::string s;
  std::error_code ec;
  const uintmax_t size = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  if (!ec && size > 0) {
    s.resize(size_t(size));
    f.read(s.data(), std::streamsize(size));
    s.resize(size_t(f.gcount()));
  }
  char chunk[1 << 16];
  while (f) {
    f.read(chunk, sizeof chunk);
    s.append(chunk, size_t(f.gcount()));
  }
  EG_CHECK(!f.bad(), "cannot read '", path, "': ", std::strerror(errno));
  return s;
}

RgbImage resize(const RgbImage& src, const Box& b, int64_t out_w, int64_t out_h) {
  EG_CHECK(
      b.x >= 0 && b.y >= 0 && b.width > 0 && b.height > 0 && b.x + b.width <= src.width && b.y + b.height <= src.height,
      "resize: box ", b.x, ",", b.y, " ", b.width, "x", b.height, " outside a ", src.width, "x", src.height, " image");
  EG_CHECK(out_w > 0 && out_h > 0, "resize: output size ", out_w, "x", out_h);
  const Taps tx = taps(b.width, out_w), ty = taps(b.height, out_h);
  // Horizontally into floats (rows of the box only), then vertically, rounding once. Each
  // sum is a chain of fused multiply-adds over the sample's taps in order (std::fma: the
  // same result whatever the compiler contracts), so the result does not depend on how
  // the loops below are vectorised. The horizontal pass runs over j = 3 o + c, the
  // output row's values, reading inputs through an index table; the vertical one over a
  // whole row of values at a time.
  const int64_t w3 = out_w * 3;
  std::vector<int32_t> at(size_t(tx.most * w3));
  std::vector<float> wt(size_t(tx.most * w3));
  for (int64_t k = 0; k < tx.most; ++k)
    for (int64_t o = 0; o < out_w; ++o)
      for (int64_t c = 0; c < 3; ++c) {
        const size_t j = size_t(k * w3 + o * 3 + c);
        at[j] = int32_t(tx.input(o, k, b.width) * 3 + c);
        wt[j] = tx.w[size_t(k * out_w + o)];
      }
  std::vector<float> mid(size_t(b.height * w3)), row(size_t(b.width * 3));
  for (int64_t y = 0; y < b.height; ++y) {
    const uint8_t* in = src.pixels.data() + ((b.y + y) * src.width + b.x) * 3;
    for (int64_t i = 0; i < b.width * 3; ++i) row[size_t(i)] = float(in[i]);
    float* m = mid.data() + y * w3;
    std::fill(m, m + w3, 0.f);
    for (int64_t k = 0; k < tx.most; ++k) {
      const int32_t* a = at.data() + k * w3;
      const float* w = wt.data() + k * w3;
      for (int64_t j = 0; j < w3; ++j) m[j] = std::fma(w[j], row[size_t(a[j])], m[j]);
    }
  }
  RgbImage out;
  out.width = out_w, out.height = out_h;
  out.pixels.resize(size_t(out_h * w3));
  std::vector<float> acc(static_cast<size_t>(w3));
  for (int64_t o = 0; o < out_h; ++o) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < ty.count[size_t(o)]; ++k) {
      const float w = ty.w[size_t(k * out_h + o)];
      const float* m = mid.data() + (ty.first[size_t(o)] + k) * w3;
      for (int64_t x = 0; x < w3; ++x) acc[size_t(x)] = std::fma(w, m[x], acc[size_t(x)]);
    }
    to_bytes(acc.data(), out.pixels.data() + o * w3, w3);
  }
  return out;
}

}  // namespace eg::data
