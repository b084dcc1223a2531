// Image files as ImageNet-style datasets hold them: JPEG (libjpeg-turbo's TurboJPEG API)
// and PNG (libpng), decoded to 8-bit RGB as PIL's Image.open(f).convert("RGB") gives it,
// and the resampling torchvision's transforms do on them.
//
// Note [Decoding as PIL does]
// Training recipes (and accuracies) were made with torchvision over PIL, so a sample
// should reach the network as it would there:
// - The format comes from the file's first bytes, never its name: ImageNet holds a PNG
//   named .JPEG, and a text file named .jpg is an error naming what it starts with.
// - PNG: grey, grey+alpha, RGB, RGBA, palette, 1/2/4/8/16 bits: to RGB, alpha dropped,
//   palette transparency ignored, 16-bit samples to their high byte, no gamma applied.
// - JPEG: grey and YCbCr through libjpeg-turbo's accurate IDCT and smooth upsampling (as
//   PIL's libjpeg defaults); CMYK and YCCK as CMYK, inverted first when the file carries
//   Adobe's APP14 marker (Photoshop stores them so, and PIL reads them as "CMYK;I"), then
//   to RGB as PIL converts CMYK: (255 - k) * (255 - c) / 255, rounded.
// - A truncated JPEG is an error, as PIL's "image file is truncated"; libjpeg-turbo's
//   other warnings (extraneous bytes before a marker, ...) are not, as in PIL.
// - libpng reports errors by longjmp: it is caught in a function that holds only plain
//   C data (decode_png_c in image_file.cpp), so no C++ frame is ever jumped over.
// - An image of more than kMaxImagePixels pixels is refused before it is decoded (PIL's
//   decompression-bomb limit).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace eg::data {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, row-major
};

enum class ImageFormat { jpeg, png, unknown };

// From the first bytes (JPEG: FF D8 FF; PNG: its 8-byte signature).
ImageFormat image_format(const std::string& bytes);

constexpr int64_t kMaxImagePixels = 178956970;  // PIL's Image.MAX_IMAGE_PIXELS x 2: an error there too

// Width and height without decoding the pixels; throws naming `path` as decode_image.
struct ImageSize {
  int64_t width = 0, height = 0;
  ImageFormat format = ImageFormat::unknown;
};
ImageSize image_size(const std::string& bytes, const std::string& path);

// Decodes `bytes` (the file `path`, named in errors) to RGB. See Note [Decoding as PIL
// does]. `reduce` 1, 2, 4 or 8 decodes a JPEG at that fraction of its size with
// libjpeg-turbo's scaled IDCT (each side rounded up), much faster than decoding it whole
// and resizing; a PNG is always decoded whole.
RgbImage decode_image(const std::string& bytes, const std::string& path, int reduce = 1);

// The whole file; throws naming it when it cannot be read.
std::string read_file(const std::string& path);

// A crop box in pixels.
struct Box {
  int64_t x = 0, y = 0, width = 0, height = 0;
};

// Resizes the box `b` of `src` to out_width x out_height, bilinear with antialiasing:
// the triangle filter widened by the reduction factor when shrinking, as PIL's
// Image.resize(..., BILINEAR) and so torchvision's Resize with its defaults (antialias on).
// Samples stay inside the box, as torchvision's resized_crop (crop, then resize) does.
RgbImage resize(const RgbImage& src, const Box& b, int64_t out_width, int64_t out_height);

}  // namespace eg::data
