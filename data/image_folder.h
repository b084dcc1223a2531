// ImageNet-style image folders (torchvision's ImageFolder layout): DIR/<class>/<image>,
// classes sorted by name, decoded when loaded (data/image_file.h), with torchvision's
// ImageNet transforms.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_file.h"
#include "data/loader.h"

namespace eg::data {

// The files of one split. Every file named *.jpg, *.jpeg or *.png (any case) in a class
// folder is an image (what it is comes from its content); others are left out and counted.
struct ImageFolder {
  std::string dir;
  std::vector<std::string> classes;  // folder names, sorted
  std::vector<std::string> files;  // sorted by class, then name
  std::vector<int64_t> labels;
  int64_t left_out = 0;  // files in class folders that are not images by their name
  int64_t size() const { return int64_t(files.size()); }
};

// DIR's class folders. With `classes` (the training split's), every class folder must be
// one of them, and the labels are their indices there. Throws naming the problem: no such
// directory, no class folders, an empty class folder, a class the training split lacks.
ImageFolder scan_image_folder(const std::string& dir, const std::vector<std::string>* classes = nullptr);

// torchvision's ImageNet transforms, a pure function of (seed, epoch, sample id):
//   training:   RandomResizedCrop(size, scale, ratio) and a horizontal flip with p 1/2;
//   evaluation: the short side resized to size / crop_pct (256 for 224), then the centre
//               size x size.
// With one channel, each image is first made grey as PIL's convert("L") does
// (torchvision's Grayscale()); then normalised with `norm`.
// A JPEG is decoded at 1/2, 1/4 or 1/8 of its size (libjpeg-turbo's scaled IDCT) when the
// crop stays at least `size` pixels on each side at that scale, as PIL's draft mode does.
struct FolderTransform {
  int64_t size = 224;
  int64_t channels = 3;  // 3: RGB; 1: grey (ITU-R 601-2 luma, as PIL's "L")
  double crop_pct = 224.0 / 256.0;  // evaluation's crop as a share of the resized short side (timm's crop_pct)
  bool train = true;
  bool scaled_decoding = true;
  double min_scale = 0.08, max_scale = 1.0, min_ratio = 3.0 / 4.0, max_ratio = 4.0 / 3.0;
  Normalization norm;  // default: ImageNet's mean and standard deviation
  FolderTransform();
  // Evaluation's resized short side: floor(size / crop_pct).
  int64_t eval_resize() const;
};

// The crop a transform takes from a w x h image for (seed, epoch, id), and whether it is
// flipped: the decision alone, without decoding.
struct CropDecision {
  Box box;
  bool flip = false;
};
CropDecision crop_decision(const FolderTransform& t, int64_t w, int64_t h, uint64_t seed, int64_t epoch, int64_t id);

// Writes one decoded image through `t` into out (f32 [channels, size, size], normalised),
// or its pixels before the normalisation (u8).
void transform_into(const RgbImage& img, const CropDecision& d, const FolderTransform& t, float* out);
void transform_into(const RgbImage& img, const CropDecision& d, const FolderTransform& t, uint8_t* out);

// An image folder as the loader's sample source. A file that cannot be read or decoded
// throws BadSample with its path and the reason: the run stops, or with the loader's
// skip_bad (--skip-bad-images) leaves it out.
class FolderSamples final : public SampleSource {
 public:
  FolderSamples(ImageFolder folder, FolderTransform t);
  int64_t size() const override { return folder_.size(); }
  Shape sample_shape() const override { return {t_.channels, t_.size, t_.size}; }
  int64_t label(int64_t id) const override { return folder_.labels[size_t(id)]; }
  void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override;
  bool has_pixels() const override { return true; }
  void load_pixels(int64_t id, uint64_t seed, int64_t epoch, uint8_t* out) const override;
  PixelAffine pixel_affine() const override { return data::pixel_affine(t_.norm, t_.channels); }
  const ImageFolder& folder() const { return folder_; }

 private:
  template <class T>
  void load_file(int64_t id, uint64_t seed, int64_t epoch, T* out) const;
  ImageFolder folder_;
  FolderTransform t_;
};

}  // namespace eg::data
