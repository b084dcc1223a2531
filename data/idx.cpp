#include "data/idx.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace eg::data {

namespace {

bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

// Whole file, gunzipped when it is gzip (gzread passes plain files through).
std::vector<uint8_t> read_all(const std::string& path) {
  EG_CHECK(file_exists(path), "cannot open '", path, "': no such file or not readable");
  gzFile f = gzopen(path.c_str(), "rb");
  EG_CHECK(f, "cannot open '", path, "'");
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    int n = gzread(f, buf.data(), unsigned(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      EG_THROW("'", path, "' is corrupt or truncated: ", msg);
    }
    if (n == 0) break;
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  }
  int rc = gzclose(f);
  EG_CHECK(rc == Z_OK, "'", path, "' is corrupt or truncated (gzip stream did not end cleanly)");
  return out;
}

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

std::string pick(const std::string& dir, const std::string& base) {
  std::string p = dir + "/" + base;
  if (file_exists(p + ".gz")) return p + ".gz";
  if (file_exists(p)) return p;
  EG_THROW("missing data file: neither '", p, ".gz' nor '", p,
           "' exists (for Fashion-MNIST install the Debian package dataset-fashion-mnist, or run tools/get-data)");
}

}  // namespace

Tensor read_idx(const std::string& path) {
  std::vector<uint8_t> b = read_all(path);
  EG_CHECK(b.size() >= 4, "'", path, "' is too short to be an IDX file (", b.size(), " bytes)");
  EG_CHECK(b[0] == 0 && b[1] == 0, "'", path, "' is not an IDX file (bad magic number)");
  EG_CHECK(b[2] == 0x08, "'", path, "' holds IDX type 0x", std::hex, int(b[2]),
           " but only unsigned bytes (0x08) are supported");
  const int nd = b[3];
  EG_CHECK(nd >= 1 && nd <= 4, "'", path, "' declares ", nd, " dimensions (expected 1 to 4)");
  EG_CHECK(b.size() >= size_t(4 + 4 * nd), "'", path, "' is truncated inside its header");
  Shape s;
  for (int i = 0; i < nd; ++i) s.push_back(int64_t(be32(&b[size_t(4 + 4 * i)])));
  const size_t header = size_t(4 + 4 * nd), want = size_t(shape_numel(s));
  EG_CHECK(b.size() - header >= want, "'", path, "' is truncated: header promises ", want, " bytes of data ",
           shape_str(s), ", file has ", b.size() - header);
  EG_CHECK(b.size() - header == want, "'", path, "' has ", b.size() - header - want, " unexpected trailing bytes");
  Tensor t = Tensor::empty(s, DType::u8);
  if (want) std::memcpy(t.raw(), b.data() + header, want);
  return t;
}

ImageDataset load_mnist_split(const std::string& dir, const std::string& split, int64_t num_classes) {
  const std::string ip = pick(dir, split + "-images-idx3-ubyte"), lp = pick(dir, split + "-labels-idx1-ubyte");
  Tensor img = read_idx(ip), lab = read_idx(lp);
  EG_CHECK(img.dim() == 3, "'", ip, "' should hold images [N, rows, cols], has shape ", shape_str(img.shape()));
  EG_CHECK(lab.dim() == 1, "'", lp, "' should hold labels [N], has shape ", shape_str(lab.shape()));
  EG_CHECK(img.size(0) == lab.size(0), "'", ip, "' has ", img.size(0), " images but '", lp, "' has ", lab.size(0),
           " labels");
  ImageDataset d;
  d.images = img.reshape({img.size(0), 1, img.size(1), img.size(2)});
  d.labels = Tensor::empty({lab.size(0)}, DType::s64);
  const uint8_t* l = lab.data<uint8_t>();
  for (int64_t i = 0; i < lab.numel(); ++i) {
    EG_CHECK(l[i] < num_classes, "'", lp, "': label ", int(l[i]), " at index ", i, " is not below ", num_classes);
    d.labels.data<int64_t>()[i] = l[i];
  }
  return d;
}

Tensor normalize_images(const Tensor& u8, double mean, double std) {
  EG_CHECK(u8.dtype() == DType::u8, "normalize_images: expected u8 images, got ", dtype_name(u8.dtype()));
  EG_CHECK(std > 0, "normalize_images: std must be positive");
  Tensor out = Tensor::empty(u8.shape(), DType::f32);
  const uint8_t* p = u8.to(Device::cpu()).data<uint8_t>();
  float* o = out.data<float>();
  const float a = float(1.0 / (255.0 * std)), b = float(-mean / std);
  for (int64_t i = 0; i < u8.numel(); ++i) o[i] = float(p[i]) * a + b;
  return out.to(u8.device());
}

}  // namespace eg::data
