// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A number is a
// pure function of (seed, counter), so the CPU and every GPU thread produce the same
// values for the same element: dropout masks and initialisations match across
// devices, and a resumed run continues the exact stream by restoring (seed, offset).
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>

#ifdef __CUDACC__
#define EG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EG_HOST_DEVICE inline
#endif

namespace eg {

struct Philox4 {
  uint32_t x[4];
};

EG_HOST_DEVICE Philox4 philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 bits: exact in float, identical on every device.
EG_HOST_DEVICE float uint_to_unit(uint32_t v) { return float(v >> 8) * (1.0f / 16777216.0f); }

// The random uniform for element i of a draw that starts at `offset`.
EG_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  return uint_to_unit(philox4x32(seed, offset + i).x[0]);
}

// Standard normal for element i (Box-Muller on two words of the same counter).
EG_HOST_DEVICE double philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  Philox4 r = philox4x32(seed, offset + i);
  double u1 = (double(r.x[0]) + 1.0) * (1.0 / 4294967297.0);  // (0, 1]
  double u2 = double(r.x[1]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

class Tensor;
struct Device;

// Note [Random state on the device]
// A CUDA graph replays its kernels with the arguments they were captured with, so a
// kernel that drew from (seed, offset) passed by value would draw the same numbers at
// every replay. Dropout therefore reads the seed and the step's first counter from
// device memory (state_on(): s64 [2] = {seed, step base}, rewritten without a host wait
// when they change) and takes by value only its draw's counter within the step, which
// is the same every step: mark_step() at the start of a training step makes the counters
// reserved after it count from there. The numbers drawn are those of (seed, offset) as
// before: element i of a draw at `offset` uses counter step_base() + (offset -
// step_base()) + i. Without mark_step() (a user's loop) the base stays where it was and
// the draws are the same numbers, only the records of two steps differ (Note [Op
// records] in kernels/ops.h). PyTorch's CUDA generator does the same for graph capture
// (a seed and offset in device memory, an offset within the graph by value).

// A stream of draws: each draw of n numbers reserves counters [offset, offset + n).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset), step_base_(offset) {}
  // A copy draws what the original would; the device copies of the state are not shared.
  Generator(const Generator& o) : seed_(o.seed_), offset_(o.offset_), step_base_(o.step_base_) {}
  Generator& operator=(const Generator& o) {
    seed_ = o.seed_, offset_ = o.offset_, step_base_ = o.step_base_;
    return *this;
  }
  ~Generator();
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
    step_base_ = offset;
  }
  uint64_t reserve(uint64_t n) {
    uint64_t o = offset_;
    offset_ += n;
    return o;
  }
  uint32_t next_u32() { return philox4x32(seed_, reserve(1)).x[0]; }
  double next_uniform() { return philox_uniform(seed_, reserve(1), 0); }

  // Note [Random state on the device]: the counters reserved from now on count from here.
  void mark_step() { step_base_ = offset_; }
  uint64_t step_base() const { return step_base_; }
  // {seed, step base} as s64 [2] on `device`, rewritten when either has changed since the
  // last call (on a GPU through a staged upload: the host does not wait).
  const Tensor& state_on(const Device& device);

  // Expires when this generator is destroyed (a copy has its own): a holder of a
  // pointer to it (nn::Dropout) checks with it that the generator is still there.
  std::weak_ptr<const void> lifetime() const { return alive_; }

 private:
  uint64_t seed_, offset_, step_base_;
  std::shared_ptr<const char> alive_ = std::make_shared<const char>();
  struct OnDevice;  // core/rng.cpp; owned (its type is incomplete here, for CUDA's sources)
  OnDevice* on_device_ = nullptr;
};

// The process-wide generator used by layer initialisers and dropout by default.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace eg
