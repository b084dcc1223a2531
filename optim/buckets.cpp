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
  for (size_t i = 0; i < params.size(); ++i) {
    if (!active[i]) {
      params[i].set_grad(Tensor());  // a frozen parameter owns no gradient memory
      continue;
    }
    const size_t nb = size_t(params[i].numel()) * dtype_size(params[i].dtype());
    const bool fits = !next.empty() && same_kind(params[next.back().members.front()], params[i]) && fill + nb <= cap_;
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

void GradBuckets::zero() {
  for (auto& b : buckets_) b.flat.zero_();
}

size_t GradBuckets::bytes() const {
  size_t s = 0;
  for (auto& b : buckets_) s += size_t(b.flat.numel()) * dtype_size(b.flat.dtype());
  return s;
}

}  // namespace eg::optim
