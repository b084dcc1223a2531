#include "optim/buckets.h"

namespace eg::optim {

bool GradBuckets::sync(const std::vector<Tensor>& params) {
  std::vector<bool> active(params.size());
  for (size_t i = 0; i < params.size(); ++i) active[i] = params[i].requires_grad();
  bool views_intact = true;  // every member's .grad is still its view (nobody replaced it)
  for (auto& b : buckets_)
    for (size_t i : b.members)
      views_intact = views_intact && params[i].grad().defined() && params[i].grad().same_storage(b.flat);
  if (active == active_ && views_intact && !buckets_.empty()) return false;

  std::vector<GradBucket> next;
  size_t fill = 0;
  auto same_kind = [&](const Tensor& a, const Tensor& b) { return a.device() == b.device() && a.dtype() == b.dtype(); };
  for (size_t i = params.size(); i-- > 0;) {  // gradient-ready order
    if (!active[i]) {
      params[i].set_grad(Tensor());  // a frozen parameter owns no gradient memory
      continue;
    }
    const size_t nb = size_t(params[i].numel()) * dtype_size(params[i].dtype());
    const size_t cap = next.size() <= 1 ? first_cap_ : cap_;
    const bool fits = !next.empty() && same_kind(params[next.back().members.front()], params[i]) && fill + nb <= cap;
    if (!fits) {
      next.push_back({});
      fill = 0;
    }
    next.back().members.push_back(i);
    fill += nb;
  }
  for (auto& b : next) {
    int64_t n = 0;
    for (size_t i : b.members) n += params[i].numel();
    const Tensor& p0 = params[b.members.front()];
    b.flat = Tensor::zeros({n}, p0.dtype(), p0.device());
    int64_t at = 0;
    for (size_t i : b.members) {
      const Tensor& p = params[i];
      Tensor view = b.flat.slice(at, at + p.numel()).reshape(p.shape());
      if (p.grad().defined()) view.copy_(p.grad());
      p.set_grad(view);
      at += p.numel();
    }
  }
  buckets_ = std::move(next);
  active_ = std::move(active);
  ++rebuilds_;
  return true;
}

void GradBuckets::set_caps(size_t cap_bytes, size_t first_cap_bytes) {
  cap_ = cap_bytes, first_cap_ = first_cap_bytes;
  buckets_.clear();  // rebuilt at the next sync()
}

uint64_t GradBuckets::layout_hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the members and sizes
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (auto& b : buckets_) {
    mix(uint64_t(b.flat.numel()));
    for (size_t m : b.members) mix(m);
    mix(~uint64_t(0));
  }
  return h;
}

void GradBuckets::zero() {
  for (auto& b : buckets_) b.flat.zero_();
}

size_t GradBuckets::bytes() const {
  size_t s = 0;
  for (auto& b : buckets_) s += size_t(b.flat.numel()) * dtype_size(b.flat.dtype());
  return s;
}

}  // namespace eg::optim
