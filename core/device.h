// Where a tensor lives: the CPU or one CUDA device.
#pragma once
#include <cstdint>
#include <string>

namespace eg {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  // "cpu", "cuda", "cuda:N"; throws eg::Error naming the bad string.
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// True when egeria was built with CUDA and a usable GPU is present. A missing
// driver or device means "no GPU", never an error.
bool cuda_available();
int cuda_device_count();
bool built_with_cuda();

// TF32 tensor cores for f32 convolutions (cuDNN) and matrix products (cuBLAS) on GPUs
// that have them (Ampere and newer). Off by default: f32 means IEEE f32 here, and the
// CUDA parity tests hold the GPU to the reference at f32 tolerances. On, a ResNet step
// runs faster at ~1e-3 relative error per product, as PyTorch's
// torch.backends.cudnn.allow_tf32 (on by default there for convolutions). Also set by
// EG_ALLOW_TF32=1 in the environment at start-up. No effect on the CPU.
void set_allow_tf32(bool on);
bool allow_tf32();

// Winograd F(4x4, 3x3) for the CPU's 3x3 stride-1 convolutions with enough channels,
// where oneDNN has it (AVX-512): 4x fewer multiplications in the inner products, and
// errors of 1.5e-6 of the output's scale against the direct algorithm's 8e-7. On by
// default; Note [Winograd convolutions] in kernels/cpu/conv2d.cpp says where it is used
// and what it measured. Off: every convolution is direct, as PyTorch's CPU ones. Also
// set by EG_CPU_WINOGRAD=0 in the environment at start-up, or `egeria train
// --cpu-winograd off`. It takes effect at the next convolution.
void set_cpu_winograd(bool on);
bool cpu_winograd();

// The activation layout between CPU convolutions (Note [Activation layouts follow the
// convolutions] in kernels/cpu/conv2d.cpp): automatic, the one oneDNN's convolutions pick on
// this CPU (NHWC where its AMX bf16 kernels run, nChw16c on AVX-512 without AMX); or one
// forced for every convolution: blocked (nChw16c where C % 16 == 0, plain otherwise), or
// nhwc. Set by EG_CPU_LAYOUT=auto|blocked|nhwc in the environment at start-up. Training
// computes the same values in each (convolutions and batch norms may round differently); it
// takes effect at the next convolution.
enum class CpuLayout : uint8_t { automatic, blocked, nhwc };
void set_cpu_layout(CpuLayout layout);
CpuLayout cpu_layout();
const char* cpu_layout_name(CpuLayout layout);  // "auto", "blocked", "nhwc"

// Note [Host syncs]
// A host sync is a point where the calling thread waits for a device: on CUDA a
// synchronous copy between host and device memory (Tensor::to from or to the host, and
// so item(), to_vector(), to(DType), from_vector onto a device; copy_ across host and
// device) or cuda::synchronize(). Each one leaves the GPU idle while the host catches up,
// so a steady-state training step should have none (issue: a GPU step that never waits).
// The count is per thread (the training thread's, not the reference model's workers'),
// and a thread that trains on the CPU counts the same Tensor calls where both sides are
// the host (to(cpu) of a host tensor, so item() and to_vector() too), so a test here holds
// a step to the count a GPU run of it would make; a thread that trains on a GPU
// (set_training_device, which dist::Strategy calls) does not count host-to-host moves.
// Not counted: the allocators' rare cudaDeviceSynchronize before returning memory to the
// system, EG_SYNC_DEBUG's, and a DeferredScalar's lagged read (Note [Deferred reads] in
// core/deferred_read.h), whose wait has the next step's kernels queued behind it, so the
// GPU does not idle. summary.json reports host_syncs_per_step.
int64_t host_syncs();  // this thread's count so far
void count_host_sync();
// The device this thread trains on (default: the CPU); returns the previous one.
Device set_training_device(Device d);
bool host_is_training_device();

}  // namespace eg
