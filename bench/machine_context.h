// The CPU (and GPU) a benchmark ran on, in its JSON's context: every CPU figure names its CPU
// (core/machine.h). Google Benchmark's own context has the host and the core count, not the
// model or the instruction set oneDNN dispatches to.
#pragma once
#include <benchmark/benchmark.h>

#include "core/machine.h"

namespace eg {

inline void add_machine_context() {
  const Machine& m = this_machine();
  benchmark::AddCustomContext("cpu", m.cpu);
  benchmark::AddCustomContext("cpu_isa", m.cpu_isa);
  benchmark::AddCustomContext("boot_id", m.boot_id);
  if (!m.gpu.empty()) benchmark::AddCustomContext("gpu", m.gpu);
}

}  // namespace eg
