// The machine a run or a benchmark ran on, as summary.json and `egeria bench step` record it.
// Our machines are not all one CPU (a 2-core AMD Zen 4 and a 2-core Intel Xeon with AMX run
// the same step at different speeds, and a fresh VM of one kind can differ from the last), so
// a figure names its CPU, and the bench scripts compare wall times only between runs of one
// machine: the same host in the same boot.
#pragma once
#include <string>

namespace eg {

struct Machine {
  std::string cpu;  // the CPU's model name (/proc/cpuinfo), e.g. "AMD EPYC 9R14"
  // The best instruction set oneDNN dispatches to here, in its words: "avx512_core_bf16"
  // (AVX512_BF16, Zen 4), "avx512_core_amx" (AMX, Sapphire Rapids), "avx2", ...
  std::string cpu_isa;
  int hardware_threads = 0;
  std::string host;  // the host name
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: one boot of one machine
  std::string gpu;  // cuda:0's name; empty without a GPU
};

// Read once per process.
const Machine& this_machine();

}  // namespace eg
