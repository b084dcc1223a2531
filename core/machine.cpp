#include "core/machine.h"

#include <oneapi/dnnl/dnnl.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "core/gpu_info.h"

namespace eg {

namespace {

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "unknown";
}

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace

const Machine& this_machine() {
  static const Machine m = [] {
    Machine r;
    r.cpu = cpu_model_name();
    r.cpu_isa = isa_name(dnnl_get_effective_cpu_isa());
    r.hardware_threads = int(std::thread::hardware_concurrency());
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) r.host = host;
    r.boot_id = first_line("/proc/sys/kernel/random/boot_id");
    r.gpu = cuda_device_name(0);
    return r;
  }();
  return m;
}

}  // namespace eg
