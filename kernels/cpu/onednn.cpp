#include "kernels/cpu/onednn.h"

namespace eg::onednn {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

std::string key_of(const Shape& s) {
  std::string k;
  for (size_t i = 0; i < s.size(); ++i) k += (i ? "x" : "") + std::to_string(s[i]);
  return k;
}

}  // namespace eg::onednn
