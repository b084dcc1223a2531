#include "core/parallel.h"

#include <omp.h>

namespace eg {
void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : omp_get_num_procs()); }
int num_threads() { return omp_get_max_threads(); }
}  // namespace eg
