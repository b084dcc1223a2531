#include "autograd/autocast.h"

#include <memory>
#include <unordered_map>

#include "autograd/node.h"
#include "kernels/ops.h"

namespace eg::autograd {

namespace {

struct CachedWeight {
  // Not held: a cached copy never keeps a dead model's weight alive. An entry whose
  // weight has died (its key's address perhaps reused since) is a miss, and is dropped.
  std::weak_ptr<TensorImpl> weight;
  uint64_t version = 0;
  Tensor low;
};

struct State {
  DType low = DType::f32;
  int depth = 0;
  std::unordered_map<const TensorImpl*, CachedWeight> cache;
};

State& state() {
  thread_local State s;
  return s;
}

// What survives the end of an outermost scope: the copies of live weights nothing trains.
void drop_trained(State& s) {
  for (auto it = s.cache.begin(); it != s.cache.end();) {
    const std::shared_ptr<TensorImpl> w = it->second.weight.lock();
    it = !w || w->requires_grad ? s.cache.erase(it) : std::next(it);
  }
}

}  // namespace

Autocast::Autocast(DType low) : prev_(state().low) {
  EG_CHECK(low == DType::f32 || low == DType::bf16 || low == DType::f16, "autocast: a scope casts to bf16 or f16, not ",
           dtype_name(low));
  state().low = low;
  ++state().depth;
}

Autocast::~Autocast() {
  State& s = state();
  s.low = prev_;
  if (--s.depth == 0) drop_trained(s);
}

DType autocast_dtype() { return state().low; }

Tensor autocast_weight(const Tensor& w) {
  State& s = state();
  if (w.dtype() == s.low) return w;
  CachedWeight& e = s.cache[&w.impl()];
  if (e.low.defined() && e.version == w.impl().version && e.low.dtype() == s.low && e.weight.lock() == w.impl_ptr())
    return e.low;
  NoGradGuard ng;
  Tensor low = Tensor::empty(w.shape(), s.low, w.device());
  ops::call(ops::cast, w, low);
  e = {w.impl_ptr(), w.impl().version, low};
  return low;
}

}  // namespace eg::autograd
