// What a GPU can do, for the checks made before a run starts (the 16-bit precisions).
#pragma once
#include <string>

namespace eg {

// cuda:index's compute capability as major * 10 + minor (80: Ampere, 90: Hopper); 0 in a
// build without CUDA or for a GPU the machine lacks.
int cuda_compute_capability(int index);
// cuda:index's name ("NVIDIA H100 80GB HBM3"); empty in a build without CUDA or for a GPU
// the machine lacks.
std::string cuda_device_name(int index);

}  // namespace eg
