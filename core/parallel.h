// CPU threading: the number of threads the fast CPU kernels (OpenMP, oneDNN) use.
#pragma once

namespace eg {
void set_num_threads(int n);  // n <= 0: all cores
int num_threads();
}  // namespace eg
